"""The shipped RBAC grants what the integration tests grant the agent, and nothing they
show it does not need."""

from __future__ import annotations

from pathlib import Path

import yaml

from agent.demo.loopback import NAMESPACED_SA_RULES, SA_RULES

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def test_rbac_matches_what_the_agent_uses() -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()))
    role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] ==
                "image-mode-agent")  # fmt: skip
    granted = {(verb, group, resource) for rule in role["rules"]
               for group in rule["apiGroups"] for resource in rule["resources"]
               for verb in rule["verbs"]}  # fmt: skip
    assert granted == set(SA_RULES)


def test_namespaced_rbac_matches_what_the_agent_uses() -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()))
    role = next(d for d in docs if d["kind"] == "Role")
    granted = {(verb, group, resource) for rule in role["rules"]
               for group in rule["apiGroups"] for resource in rule["resources"]
               for verb in rule["verbs"]}  # fmt: skip
    assert granted == set(NAMESPACED_SA_RULES)
    assert role["rules"][0]["resourceNames"] == ["kubeconfig-data"]
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"]


def test_daemonset_parses_and_runs_the_agent() -> None:
    ds = yaml.safe_load((DEPLOY / "daemonset.yaml").read_text())
    container = ds["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:5] == ["image-mode-agent", "run", "--source", "kube", "--host"]
    assert ds["spec"]["template"]["spec"]["hostPID"] is True
