"""kubernetes-asyncio without its every model and API class (agent/cluster/kubeclient.py): the
agent's cluster modules load a dozen of its modules, what they use works, and code that uses
the package in full still gets all of it. Each case runs in a fresh interpreter: what the
import system holds is the subject. Memory figures come from bench/live_apply.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LOADED = """
import sys
def loaded():
    return sorted(m for m in sys.modules if m.split(".")[0] == "kubernetes_asyncio")
"""


def run(code: str, tmp_path: Path) -> dict:
    """Run `code` in a fresh interpreter; it prints one JSON document as its last line."""
    done = subprocess.run([sys.executable, "-c", LOADED + textwrap.dedent(code)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_cluster_mode_loads_no_model_and_no_api_class(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": {"token": "t0k3n"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))  # fmt: skip
    out = run(f"""
        import asyncio, json
        import agent.app.cli, agent.app.runtime, agent.cluster.agent, agent.cluster.watch
        from agent.cluster.kube import Kube

        async def main():
            kube = await Kube.connect({str(kubeconfig)!r})
            cfg = kube.api.configuration
            await kube.close()
            return cfg.host, cfg.api_key

        host, api_key = asyncio.run(main())
        print(json.dumps({{"host": host, "api_key": api_key, "loaded": loaded()}}))
    """, tmp_path)  # fmt: skip
    assert out["host"] == "https://127.0.0.1:6443"
    assert out["api_key"] == {"BearerToken": "Bearer t0k3n"}
    loaded = out["loaded"]
    assert "kubernetes_asyncio.client.models.v1_pod" not in loaded
    assert not [m for m in loaded if m.startswith("kubernetes_asyncio.client.models.")]
    assert not [m for m in loaded if m.startswith("kubernetes_asyncio.client.api.")]
    others = tuple(f"kubernetes_asyncio.{p}" for p in ("dynamic", "stream", "utils", "watch"))
    assert not [m for m in loaded if m.startswith(others)]
    assert len(loaded) < 25, loaded  # 15 with kubernetes-asyncio 36: client and config only


def test_models_are_deserialised_loading_only_their_own_modules(tmp_path: Path) -> None:
    node = {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "worker-0", "annotations": {"a": "b"},
                     "creationTimestamp": "2024-05-01T10:00:00Z"},
        "spec": {"unschedulable": True, "taints": [{"key": "k", "effect": "NoSchedule"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip
    out = run(f"""
        import asyncio, json
        from types import SimpleNamespace
        from agent.cluster.kubeclient import ApiClient

        async def client():
            return ApiClient()

        api = asyncio.run(client())  # its aiohttp connector wants a running loop
        node = api.deserialize(SimpleNamespace(data={json.dumps(node)!r}), "V1Node")
        print(json.dumps({{
            "type": type(node).__name__, "annotations": node.metadata.annotations,
            "year": node.metadata.creation_timestamp.year, "taint": node.spec.taints[0].effect,
            "condition": type(node.status.conditions[0]).__name__,
            "back": api.sanitize_for_serialization(node)["metadata"]["name"],
            "loaded": loaded(),
        }}))
    """, tmp_path)  # fmt: skip
    assert out["type"] == "V1Node"
    assert out["annotations"] == {"a": "b"}
    assert out["year"] == 2024
    assert out["taint"] == "NoSchedule"
    assert out["condition"] == "V1NodeCondition"
    assert out["back"] == "worker-0"
    models = [m for m in out["loaded"] if m.startswith("kubernetes_asyncio.client.models.")]
    assert "kubernetes_asyncio.client.models.v1_node_condition" in models
    assert "kubernetes_asyncio.client.models.v1_pod" not in models
    assert len(models) < 15, models  # the Node's own model and its nested ones


def test_code_using_the_whole_package_still_gets_it(tmp_path: Path) -> None:
    out = run("""
        import json
        import agent.cluster.kube
        import kubernetes_asyncio
        from kubernetes_asyncio import client, config, watch
        from kubernetes_asyncio.client import ApiException, CoreV1Api, V1Pod
        from kubernetes_asyncio.dynamic import DynamicClient

        assert client.CustomObjectsApi and watch.Watch and config.load_kube_config
        assert client.models.V1Pod is V1Pod and client.ApiClient.__name__ == "ApiClient"
        # A name no line of kubernetes_asyncio/client/__init__.py imports: the whole __init__
        # runs, then AttributeError as from the ordinary package.
        try:
            client.NoSuchThing
        except AttributeError:
            pass
        else:
            raise AssertionError("NoSuchThing resolved")
        print(json.dumps({"version": kubernetes_asyncio.__version__, "pod": V1Pod.__name__,
                          "api": CoreV1Api.__name__, "loaded": len(loaded())}))
    """, tmp_path)  # fmt: skip
    assert out["version"][0].isdigit()
    assert (out["pod"], out["api"]) == ("V1Pod", "CoreV1Api")
    # kubernetes_asyncio/client/__init__.py ran: every API class and model
    assert out["loaded"] > 500


def test_an_already_imported_package_is_left_alone(tmp_path: Path) -> None:
    out = run("""
        import json
        import kubernetes_asyncio.client
        before = kubernetes_asyncio.client
        from agent.cluster.kubeclient import ApiClient
        print(json.dumps({"same": ApiClient is before.ApiClient,
                          "getattr": "__getattr__" in vars(before)}))
    """, tmp_path)  # fmt: skip
    assert out == {"same": True, "getattr": False}
