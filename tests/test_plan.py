"""Diff and plan tables, including the MCD's own unit-test tables (openshift/machine-config-operator
7ff337a4ffac8e7562692181178ede61e4b2eec5: pkg/daemon/update_test.go,
pkg/controller/common/reconcile_test.go) re-derived for image mode: what the MCD applied with a
reboot arrives here in a new image."""

from __future__ import annotations

from typing import Any

import pytest

from agent.core.plan import LiveStep, Plan, live_summary, plan_update
from agent.core.policy import (
    BUILTIN_POLICY,
    USER_CA_BUNDLE,
    Action,
    LivePolicy,
    policy_from_machine_configuration,
)
from agent.core.reconcile import unreconcilable_reasons
from agent.model.imageref import parse_image_ref
from agent.model.machineconfig import machine_config_from_object
from tests.builders import IMAGE_A, IMAGE_B, ign_file, machine_config

PULL = "/var/lib/kubelet/config.json"
REGISTRIES = "/etc/containers/registries.conf"
POLICY_JSON = "/etc/containers/policy.json"
GPG = "/etc/machine-config-daemon/no-reboot/containers-gpg.pub"
KUBELET_CA = "/etc/kubernetes/kubelet-ca.crt"
SSH = "/home/core/.ssh/authorized_keys.d/ignition"


def _reload(unit: str) -> dict:
    return {"type": "Reload", "reload": {"serviceName": unit}}


def _restart(unit: str) -> dict:
    return {"type": "Restart", "restart": {"serviceName": unit}}


# The MCO's default NodeDisruptionPolicy status (docs/mco-protocol.md §13), as the operator writes
# it.
DEFAULT_NDP = {
    "metadata": {"name": "cluster", "generation": 3},
    "status": {
        "observedGeneration": 3,
        "nodeDisruptionPolicyStatus": {
            "clusterPolicies": {
                "files": [
                    {"path": PULL, "actions": [{"type": "None"}]},
                    {"path": GPG, "actions": [_reload("crio.service")]},
                    {"path": POLICY_JSON, "actions": [_reload("crio.service")]},
                    {"path": REGISTRIES, "actions": [{"type": "Special"}]},
                    {"path": "/etc/containers/registries.d", "actions": [_reload("crio.service")]},
                    {
                        "path": USER_CA_BUNDLE,
                        "actions": [
                            _restart("coreos-update-ca-trust.service"),
                            _restart("crio.service"),
                        ],
                    },
                    {
                        "path": "/etc/kubernetes/credential-providers",
                        "actions": [_restart("kubelet.service")],
                    },
                ],
                "units": [
                    {
                        "name": "iri-registry.service",
                        "actions": [{"type": "DaemonReload"}, _restart("iri-registry.service")],
                    }
                ],
                "sshkey": {"actions": [{"type": "None"}]},
            }
        },
    },
}
NDP_POLICY = BUILTIN_POLICY.extended(policy_from_machine_configuration(DEFAULT_NDP))


def mc(**kwargs: Any):
    return machine_config_from_object(machine_config(**kwargs))


def plan(old: dict, new: dict, policy: LivePolicy = BUILTIN_POLICY, *, booted=IMAGE_A, target=None):
    current = machine_config_from_object(old)
    desired = machine_config_from_object(new)
    target_ref = target or desired.os_image_url
    return plan_update(
        current,
        desired,
        booted=parse_image_ref(booted) if booted else None,
        target=parse_image_ref(target_ref) if target_ref else None,
        policy=policy,
    )


F = ign_file

# TestCalculatePostConfigChangeAction (update_test.go:544), re-derived. Columns: old files/keys,
# new files/keys, extras; MCD result; ours with only the built-in allowlist (no new image);
# ours with the default NodeDisruptionPolicy status; the follow-ups with that policy.
MCD_TABLE = [
    # 0 arbitrary file: MCD reboots; image content here, refused without a new image
    ("random file", [F("/etc/random-reboot-file", "a")], [F("/etc/random-reboot-file", "b")],
     {}, "reboot", "refused", "refused", ()),
    # 1 pull secret
    ("pull secret", [F(PULL, "a")], [F(PULL, "b")], {}, "none", "live", "live", ()),
    # 2 SSH key
    ("ssh key", [], [], {"keys": ("key1", "key2")}, "none", "live", "live", ()),
    # 3 registries.conf
    ("registries.conf", [F(REGISTRIES, "a")], [F(REGISTRIES, "b")], {}, "reload crio",
     "refused", "live", ("reload crio.service",)),
    # 4 kubelet CA
    ("kubelet ca", [F(KUBELET_CA, "a")], [F(KUBELET_CA, "b")], {}, "none", "live", "live", ()),
    # 5 registries.conf + pull secret
    ("registries+pull", [F(REGISTRIES, "a"), F(PULL, "a")], [F(REGISTRIES, "b"), F(PULL, "b")],
     {}, "reload crio", "refused", "live", ("reload crio.service",)),
    # 7 pull secret added
    ("pull added", [], [F(PULL, "b")], {}, "none", "live", "live", ()),
    # 8 registries.conf removed, other file unchanged
    ("registries removed", [F(REGISTRIES, "a"), F("/etc/other", "o")], [F("/etc/other", "o")],
     {}, "reload crio", "refused", "live", ("reload crio.service",)),
    # 10 policy.json
    ("policy.json", [F(POLICY_JSON, "a")], [F(POLICY_JSON, "b")], {}, "reload crio", "refused",
     "live", ("reload crio.service",)),
    # 11 gpg key
    ("gpg", [F(GPG, "a")], [F(GPG, "b")], {}, "reload crio", "refused", "live",
     ("reload crio.service",)),
    # 12 user CA bundle: the one live file with a follow-up in the built-in list
    ("user ca", [F(USER_CA_BUNDLE, "a")], [F(USER_CA_BUNDLE, "b")], {}, "restart crio", "live",
     "live", ("restart coreos-update-ca-trust.service", "restart crio.service")),
    # 13 user CA bundle + gpg added
    ("user ca+gpg", [F(USER_CA_BUNDLE, "a")], [F(USER_CA_BUNDLE, "b"), F(GPG, "g")], {},
     "restart crio", "refused", "live",
     ("restart coreos-update-ca-trust.service", "restart crio.service")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("old_files", "new_files", "extra", "mcd", "builtin", "with_ndp", "then"),
    [row[1:] for row in MCD_TABLE],
    ids=[row[0] for row in MCD_TABLE],
)
def test_mcd_post_config_change_table(old_files, new_files, extra, mcd, builtin, with_ndp, then):
    keys = extra.get("keys", (None, None))
    old = machine_config(files=old_files, keys=[keys[0]] if keys[0] else None)
    new = machine_config(name="rendered-worker-2", files=new_files,
                         keys=[keys[1]] if keys[1] else None)  # fmt: skip
    assert plan(old, new).verdict == builtin
    result = plan(old, new, NDP_POLICY)
    assert result.verdict == with_ndp
    assert result.follow_ups == then
    if with_ndp == "live":
        assert not result.reboot
        # Special (registries.conf) drains unless proven safe; everything else does not.
        assert result.drain == any("registries.conf" in s.path for s in result.live)


def test_mcd_row_6_image_change_with_live_parts() -> None:
    """registries + SSH + osImageURL change: the MCD reboots; here the image carries the file
    and the SSH key is written live before the reboot."""
    old = machine_config(files=[F(REGISTRIES, "a")], keys=["k1"], image=IMAGE_A)
    new = machine_config(files=[F(REGISTRIES, "b")], keys=["k2"], image=IMAGE_B)
    result = plan(old, new)
    assert result.verdict == "image"
    assert result.reboot and result.drain
    assert result.image_changes == ("osImageURL", "files")
    assert [s.path for s in result.live] == [SSH]
    assert result.target_image == IMAGE_B


def test_mcd_row_9_karg_added_needs_image() -> None:
    old = machine_config(files=[F(REGISTRIES, "a")], keys=["k1"])
    new = machine_config(files=[F(PULL, "p"), F(KUBELET_CA, "c")], keys=["k2"], kargs=["x=1"])
    result = plan(old, new)
    assert result.verdict == "refused"
    assert set(result.image_changes) == {"files", "kernelArguments"}
    result = plan(old, new, target=IMAGE_B)
    assert result.verdict == "image"
    assert {s.path for s in result.live} == {PULL, "/run/ostree/auth.json", KUBELET_CA, SSH}


# TestMachineConfigDiff / TestReconcilableDiff (update_test.go:86, :256), as verdicts.
DIFF_TABLE = [
    ("empty/empty", {}, {}, "none", ()),
    ("kargs nil vs []", {"kargs": None}, {"kargs": []}, "none", ()),
    ("key added", {}, {"keys": ["k"]}, "live", ()),
    ("key changed", {"keys": ["a"]}, {"keys": ["b"]}, "live", ()),
    ("password added", {"keys": ["a"]},
     {"users": [{"name": "core", "sshAuthorizedKeys": ["a"], "passwordHash": "$6$x"}]}, "live", ()),
    ("file added", {}, {"files": [F("/etc/x")]}, "refused", ("files",)),
    ("all files removed", {"files": [F("/etc/x")]}, {"files": []}, "refused", ("files",)),
    ("unit added", {}, {"units": [{"name": "a.service", "contents": "x"}]}, "refused", ("units",)),
    ("extensions", {}, {"extensions": ["usbguard"]}, "refused", ("extensions",)),
    ("kernel type", {}, {"kernel_type": "realtime"}, "refused", ("kernelType",)),
    ("kernel type default == ''", {"kernel_type": ""}, {"kernel_type": "default"}, "none", ()),
    ("kargs reordered", {"kargs": ["a", "b"]}, {"kargs": ["b", "a"]}, "refused",
     ("kernelArguments",)),
    ("kargs duplicate", {"kargs": ["a"]}, {"kargs": ["a", "a"]}, "refused", ("kernelArguments",)),
    ("os image", {}, {"image": IMAGE_B}, "image", ("osImageURL",)),
]  # fmt: skip


@pytest.mark.parametrize(("old", "new", "verdict", "changes"), [r[1:] for r in DIFF_TABLE],
                         ids=[r[0] for r in DIFF_TABLE])  # fmt: skip
def test_diff_table(old: dict, new: dict, verdict: str, changes: tuple) -> None:
    result = plan(machine_config(**old), machine_config(name="rendered-worker-2", **new))
    assert result.verdict == verdict
    assert result.image_changes == changes


# TestIsRenderedConfigReconcilable / TestReconcilableSSH (reconcile_test.go:14, :195;
# docs/mco-protocol.md §14).
# Each rule both ways: the last column is why going back (desired -> current) is refused, or
# None where only the forward change breaks the rule (a link removed, a non-core user dropped).
REFUSED = [
    ("ignition 4.0.0", {}, {"version": "4.0.0"}, "ignition version 4.0.0 is not supported",
     None),
    ("ignition 3.6.0", {}, {"version": "3.6.0"}, "ignition version 3.6.0 is not supported",
     None),
    ("disks", {}, {"ignition_extra": {"storage": {"disks": [{"device": "/dev/sdb"}]}}},
     "ignition disks section contains changes", "ignition disks section contains changes"),
    ("filesystems", {}, {"ignition_extra": {"storage": {"filesystems": [{"path": "/var"}]}}},
     "ignition filesystems section contains changes",
     "ignition filesystems section contains changes"),
    ("raid", {}, {"ignition_extra": {"storage": {"raid": [{"name": "md0"}]}}},
     "ignition raid section contains changes", "ignition raid section contains changes"),
    ("directories", {}, {"ignition_extra": {"storage": {"directories": [{"path": "/etc/d"}]}}},
     "ignition directories section contains changes",
     "ignition directories section contains changes"),
    ("link added", {}, {"ignition_extra": {"storage": {"links": [{"path": "/etc/l",
     "target": "/x"}]}}}, "ignition links section contains added links: /etc/l", None),
    ("group added", {}, {"ignition_extra": {"passwd": {"groups": [{"name": "admins"}]}}},
     "ignition passwd groups section contains changes",
     "ignition passwd groups section contains changes"),
    ("ignition kargs", {}, {"ignition_extra": {"kernelArguments": {"shouldExist": ["x"]}}},
     "ignition kernelArguments section contains changes",
     "ignition kernelArguments section contains changes"),
    ("fips on", {}, {"fips": True}, "detected change to FIPS flag",
     "detected change to FIPS flag"),
    ("fips off", {"fips": True}, {"fips": False}, "detected change to FIPS flag",
     "detected change to FIPS flag"),
    ("append", {}, {"files": [{"path": "/etc/a", "append": [{"source": "data:,x"}]}]},
     "ignition file /etc/a includes append", None),
    ("force file", {}, {"files": [F("/run/machine-config-daemon-force")]}, "MCD force file",
     None),
    ("relative path", {}, {"files": [F("etc/relative")]}, "not an absolute, normalized path",
     None),
    ("dotdot path", {}, {"files": [F("/etc/../shadow")]}, "not an absolute, normalized path",
     None),
    ("non-core user", {"keys": ["a"]}, {"users": [{"name": "core", "sshAuthorizedKeys": ["a"]},
     {"name": "bob", "sshAuthorizedKeys": ["b"]}]}, "user 'bob' (only user core", None),
    ("core homeDir", {"keys": ["a"]}, {"users": [{"name": "core", "sshAuthorizedKeys": ["a"],
     "homeDir": "/var/home/core"}]}, "user core fields homeDir", None),
    ("core zero keys", {"keys": ["a"]}, {"users": [{"name": "core", "sshAuthorizedKeys": []}]},
     "has no SSH keys and no password hash", None),
]  # fmt: skip


@pytest.mark.parametrize(("old", "new", "reason"), [r[1:4] for r in REFUSED],
                         ids=[r[0] for r in REFUSED])  # fmt: skip
def test_refused_changes(old: dict, new: dict, reason: str) -> None:
    result = plan(machine_config(**old), machine_config(name="rendered-worker-2", **new))
    assert result.verdict == "refused"
    assert result.reasons[0].startswith(
        "can't reconcile config rendered-worker-1 with rendered-worker-2: "
    )
    assert any(reason in r for r in result.reasons), result.reasons
    # A refused change is refused even when a new image comes with it.
    assert plan(machine_config(**old), machine_config(**new), target=IMAGE_B).verdict == "refused"


@pytest.mark.parametrize(("old", "new", "reason", "back"), [r[1:] for r in REFUSED],
                         ids=[r[0] for r in REFUSED])  # fmt: skip
def test_refusal_rules_both_ways(old: dict, new: dict, reason: str, back: str | None) -> None:
    """The rule alone (no image-content verdict mixed in), forward and back."""

    def reasons(current: dict, desired: dict) -> list[str]:
        return unreconcilable_reasons(
            machine_config_from_object(machine_config(**current)),
            machine_config_from_object(machine_config(name="rendered-worker-2", **desired)),
        )

    assert any(reason in r for r in reasons(old, new))
    backward = reasons(new, old)
    if back is None:
        assert backward == []
    else:
        assert any(back in r for r in backward), backward
    assert reasons(old, old) == []


RECONCILABLE = [
    ("users nil", {"keys": ["a"]}, {"users": None}),
    ("link removed", {"ignition_extra": {"storage": {"links": [{"path": "/l", "target": "/x"}]}}},
     {}),
    ("luks removed", {"ignition_extra": {"storage": {"luks": [{"name": "root"}]}}}, {}),
    ("core password only", {"keys": ["a"]},
     {"users": [{"name": "core", "passwordHash": "$6$x"}]}),
]  # fmt: skip


@pytest.mark.parametrize(("old", "new"), [r[1:] for r in RECONCILABLE],
                         ids=[r[0] for r in RECONCILABLE])  # fmt: skip
def test_reconcilable_changes(old: dict, new: dict) -> None:
    assert plan(machine_config(**old), machine_config(**new)).verdict in ("none", "live")


def test_image_needs_digest_pin() -> None:
    result = plan(machine_config(), machine_config(image="quay.example/os/node:latest"))
    assert result.verdict == "refused"
    assert "is not pinned by digest" in result.reasons[0]


def test_same_digest_under_another_name_is_not_an_update() -> None:
    mirror = "mirror.example/os/node@" + IMAGE_A.split("@")[1]
    assert plan(machine_config(), machine_config(image=mirror)).verdict == "none"


def test_desired_image_override_wins() -> None:
    result = plan(machine_config(), machine_config(), target=IMAGE_B)
    assert (result.verdict, result.target_image) == ("image", IMAGE_B)


def test_failed_digest_is_not_staged_again() -> None:
    current, desired = mc(), mc(image=IMAGE_B)
    result = plan_update(current, desired, booted=parse_image_ref(IMAGE_A),
                         target=parse_image_ref(IMAGE_B),
                         failed_digests=frozenset({IMAGE_B.split("@")[1]}))  # fmt: skip
    assert result.verdict == "refused"
    assert "failed on this host before" in result.reasons[0]


def test_live_only_never_reboots_or_drains() -> None:
    old = machine_config(files=[F(PULL, "a"), F(USER_CA_BUNDLE, "a")], keys=["a"])
    new = machine_config(files=[F(PULL, "b"), F(USER_CA_BUNDLE, "b")], keys=["b"])
    result = plan(old, new)
    assert (result.verdict, result.reboot, result.drain) == ("live", False, False)
    assert result.follow_ups == ("update-ca-trust", "restart crio.service")


def test_pull_secret_is_mirrored_for_bootc_with_mode_0600() -> None:
    result = plan(machine_config(), machine_config(files=[F(PULL, "secret", mode=0o644)]))
    steps = {s.path: s for s in result.live}
    assert set(steps) == {PULL, "/run/ostree/auth.json"}
    assert all(s.mode == 0o600 and s.secret for s in steps.values())
    assert "secret" not in repr(steps[PULL])  # contents never reach a repr or a log


def test_pull_secret_removed_is_deleted_kubelet_ca_never() -> None:
    old = machine_config(files=[F(PULL, "a"), F(KUBELET_CA, "c")])
    result = plan(old, machine_config(files=[]))
    assert [(s.path, s.action) for s in result.live] == [
        (PULL, "delete"), ("/run/ostree/auth.json", "delete"),
    ]  # fmt: skip


def test_ssh_keys_of_all_users_one_per_line() -> None:
    result = plan(machine_config(), machine_config(keys=["k1", "k2"]))
    (step,) = result.live
    assert (step.path, step.contents, step.mode) == (SSH, b"k1\nk2\n", 0o600)
    assert (step.user.name, step.group.name) == ("core", "core")


def test_first_start_applies_only_the_live_part() -> None:
    desired = mc(files=[F("/etc/image-content"), F(PULL, "p")], keys=["k"], kargs=["x"])
    result = plan_update(None, desired, booted=parse_image_ref(IMAGE_A),
                         target=parse_image_ref(IMAGE_A))  # fmt: skip
    assert result.verdict == "live"
    assert {s.path for s in result.live} == {PULL, "/run/ostree/auth.json", SSH}
    result = plan_update(None, desired, booted=parse_image_ref(IMAGE_B),
                         target=parse_image_ref(IMAGE_A))  # fmt: skip
    assert (result.verdict, result.image_changes) == ("image", ("osImageURL",))


# NodeDisruptionPolicy semantics (docs/mco-protocol.md §13, TestFindClosestFilePolicyPathMatch at
# update_test.go:718).
def test_longest_prefix_file_match() -> None:
    reload_a, reload_b = Action("Reload", "a.service"), Action("Reload", "b.service")
    policy = LivePolicy(files={"/etc/mco/f1": (reload_a,), "/etc/mco/f1/f2": (reload_b,),
                               "/etc/mco/f1/f2/f3": (Action("Restart", "c.service"),)})  # fmt: skip
    assert policy.file_actions("/etc/mco/f1/f2/example") == (reload_b,)
    assert policy.file_actions("/etc/mco/f1/f2/f3") == (Action("Restart", "c.service"),)
    assert policy.file_actions("/etc/mco/f1x") is None  # a sibling, not a child
    assert LivePolicy(files={"/etc/mco/f1/f2/f3": ()}).file_actions("/etc/mco/f1/f2") is None
    assert LivePolicy().file_actions("/etc/x") is None


def test_reboot_action_keeps_a_path_image_content() -> None:
    policy = LivePolicy(files={"/etc/x": (Action("Reboot"),)})
    assert policy.file_actions("/etc/x") is None


def test_ndp_drain_action_drains_without_reboot() -> None:
    policy = BUILTIN_POLICY.extended(LivePolicy(files={"/etc/app.conf": (Action("Drain"),)}))
    result = plan(machine_config(files=[F("/etc/app.conf", "a")]),
                  machine_config(files=[F("/etc/app.conf", "b")]), policy)  # fmt: skip
    assert (result.verdict, result.drain, result.reboot) == ("live", True, False)


def test_ndp_unit_contents_live_enablement_image() -> None:
    old = machine_config(units=[{"name": "iri-registry.service", "contents": "a"}])
    new = machine_config(units=[{"name": "iri-registry.service", "contents": "b",
                                 "dropins": [{"name": "10-x.conf", "contents": "y"}]}])  # fmt: skip
    result = plan(old, new, NDP_POLICY)
    assert result.verdict == "live"
    assert [s.path for s in result.live] == [
        "/etc/systemd/system/iri-registry.service",
        "/etc/systemd/system/iri-registry.service.d/10-x.conf",
    ]
    assert result.follow_ups == ("daemon-reload", "restart iri-registry.service")
    enabled = machine_config(units=[{"name": "iri-registry.service", "contents": "b",
                                     "enabled": True}])  # fmt: skip
    assert plan(old, enabled, NDP_POLICY).image_changes == ("units",)


def test_ndp_status_read_only_when_observed() -> None:
    stale = {**DEFAULT_NDP, "metadata": {"name": "cluster", "generation": 4}}
    assert policy_from_machine_configuration(stale) is None


def test_plan_json_contract_shape() -> None:
    body = plan(machine_config(keys=["a"]), machine_config(keys=["b"])).to_json()
    assert set(body) >= {"verdict", "reboot", "drain", "target_image", "live", "image_changes",
                         "reasons"}  # fmt: skip
    assert body["live"] == [{"path": SSH, "action": "write", "then": []}]


# -- the plan's log lines --------------------------------------------------------------------
def test_the_summary_counts_live_files_and_never_cuts_the_list() -> None:
    steps = tuple(LiveStep(path=f"/etc/f{i}", action="write") for i in range(5))
    reasons = ("OS image changes from a to b", "live: write /etc/f0")
    target = "quay.example/os@sha256:" + "1" * 64
    image = Plan("image", reboot=True, target_image=target, live=steps, reasons=reasons)
    assert image.summary() == "OS image changes from a to b; 5 live file(s) to bring to the config"
    # The one that changed is named, wherever it is in the plan; the rest are counted.
    assert live_summary(image, [steps[4]]) == (
        "applied 1 live change(s): write /etc/f4; 4 already as desired; next: stage "
        f"{image.target_image}, then reboot into it"
    )
    live = Plan("live", live=steps[:2])
    assert live_summary(live, []) == "live files already as desired (2): nothing written; no reboot"
    assert live_summary(Plan("revert", live=steps[:1]), steps[:1]) == (
        "applied 1 live change(s): write /etc/f0"
    )
