"""Where the conformance tier finds the peer binaries the user supplies (KIT_BIN, the kit's bin/,
KUBEBUILDER_ASSETS, PATH), with fake executables in temp folders; the tier's "not run" lines,
from the whole tier down to one test; and the closing count of .ci/run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conformance import peers
from tests.conformance.__main__ import tally

REPO = Path(__file__).resolve().parents[1]


def fake_bin(folder: Path, *names: str, executable: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = folder / name
        path.write_text("#!/bin/sh\necho fake\n")
        path.chmod(0o755 if executable else 0o644)
    return folder


def fake_kit(tmp_path: Path) -> Path:
    kit = tmp_path / "kit"
    for script in ("cluster-up", "mcc-up", "unpack"):
        fake_bin(kit, script)
    (kit / "crds").mkdir()
    (kit / "bin").mkdir()
    return kit


def sources(found: dict[str, peers.Found]) -> dict[str, str]:
    return {name: f.source for name, f in found.items()}


def test_kit_bin_comes_first_then_kit_then_envtest_then_path(tmp_path: Path) -> None:
    kit = fake_kit(tmp_path)
    every = ("kube-apiserver", "etcd", "kubectl", "machine-config-controller",
             "hypershift-inplace")  # fmt: skip
    env = {
        "KIT_BIN": str(fake_bin(tmp_path / "kit-bin", *every)),
        "KUBEBUILDER_ASSETS": str(fake_bin(tmp_path / "envtest", *peers.CLUSTER)),
        "PATH": str(fake_bin(tmp_path / "usr-bin", "etcd", "kubectl")),
    }
    found = peers.find_all(env, kit)
    assert sources(found) == dict.fromkeys(every, "KIT_BIN")
    assert found["etcd"].path == tmp_path / "kit-bin" / "etcd"

    (tmp_path / "kit-bin" / "kube-apiserver").unlink()
    fake_bin(kit / "bin", "kube-apiserver")
    (tmp_path / "kit-bin" / "etcd").unlink()
    (tmp_path / "kit-bin" / "kubectl").unlink()
    (tmp_path / "envtest" / "kubectl").unlink()
    found = peers.find_all(env, kit)
    assert sources(found) == {
        "kube-apiserver": "the kit's bin/",
        "etcd": "KUBEBUILDER_ASSETS",
        "kubectl": "PATH",
        "machine-config-controller": "KIT_BIN",
        "hypershift-inplace": "KIT_BIN",
    }


def test_envtest_assets_and_debian_packages_serve_a_cluster(tmp_path: Path) -> None:
    debian = fake_bin(tmp_path / "usr-bin", "etcd", "kubectl")
    env = {"KUBEBUILDER_ASSETS": str(fake_bin(tmp_path / "envtest", "kube-apiserver")),
           "PATH": os.pathsep.join([str(tmp_path / "nothing"), str(debian)])}  # fmt: skip
    found = peers.find_all(env)
    assert sources(found) == {"kube-apiserver": "KUBEBUILDER_ASSETS", "etcd": "PATH",
                              "kubectl": "PATH", "machine-config-controller": "",
                              "hypershift-inplace": ""}  # fmt: skip
    assert peers.why_not_run(found) is None
    assert peers.why_not_run(found, (peers.MCC,)) == (
        "no machine-config-controller: set KIT_BIN to a folder that also holds it"
    )


def test_only_etcd_and_kubectl_are_taken_from_path(tmp_path: Path) -> None:
    every = ("kube-apiserver", "etcd", "kubectl", "machine-config-controller",
             "hypershift-inplace")  # fmt: skip
    found = peers.find_all({"PATH": str(fake_bin(tmp_path / "usr-bin", *every))})
    assert sources(found) == {"kube-apiserver": "", "etcd": "PATH", "kubectl": "PATH",
                              "machine-config-controller": "",
                              "hypershift-inplace": ""}  # fmt: skip
    assert peers.why_not_run(found) == "no kube-apiserver: set KIT_BIN or KUBEBUILDER_ASSETS"


def test_a_file_that_is_not_executable_is_not_a_binary(tmp_path: Path) -> None:
    env = {"KIT_BIN": str(fake_bin(tmp_path / "a", *peers.CLUSTER, executable=False)),
           "KUBEBUILDER_ASSETS": str(fake_bin(tmp_path / "b", *peers.CLUSTER))}  # fmt: skip
    assert set(sources(peers.find_all(env)).values()) == {"KUBEBUILDER_ASSETS", ""}
    (tmp_path / "c" / "kube-apiserver").mkdir(parents=True)  # a folder named like it is not it
    assert peers.find("kube-apiserver", {"KIT_BIN": str(tmp_path / "c")}).path is None


def test_nothing_found_names_the_api_server_first(tmp_path: Path) -> None:
    found = peers.find_all({"PATH": str(tmp_path)}, fake_kit(tmp_path))
    assert peers.missing(found) == ["kube-apiserver", "etcd", "kubectl"]
    assert peers.why_not_run(found) == "no kube-apiserver: set KIT_BIN or KUBEBUILDER_ASSETS"
    assert "etcd: not found" in peers.describe(found)


def test_linked_into_one_folder_for_the_kits_scripts(tmp_path: Path) -> None:
    envtest = fake_bin(tmp_path / "envtest", *peers.CLUSTER)
    # A binary whose real file has another name (a Debian alternatives link, say): the kit
    # recognises its processes by /proc/PID/exe, so it is not symlinked.
    fake_bin(tmp_path / "opt", "etcd-3.5")
    (tmp_path / "usr-bin").mkdir()
    (tmp_path / "usr-bin" / "etcd").symlink_to(tmp_path / "opt" / "etcd-3.5")
    found = peers.find_all({"KUBEBUILDER_ASSETS": str(envtest), "PATH": str(tmp_path / "usr-bin")})
    found["etcd"] = peers.find("etcd", {"PATH": str(tmp_path / "usr-bin")})
    folder = peers.link_into(found, tmp_path / "bin")
    assert sorted(p.name for p in folder.iterdir()) == ["etcd", "kube-apiserver", "kubectl"]
    assert (folder / "kube-apiserver").resolve() == envtest / "kube-apiserver"
    assert not (folder / "etcd").is_symlink() and os.access(folder / "etcd", os.X_OK)
    assert (folder / "etcd").read_text() == "#!/bin/sh\necho fake\n"
    peers.link_into(found, folder)  # again: replaced in place
    assert sorted(p.name for p in folder.iterdir()) == ["etcd", "kube-apiserver", "kubectl"]


def tier(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("KIT_BIN", "KUBEBUILDER_ASSETS")}
    return subprocess.run([sys.executable, "-m", "tests.conformance", *args], cwd=REPO,
                          env={**clean, **env}, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_tier_without_binaries_is_not_run(tmp_path: Path) -> None:
    """As in CI: the kit (which ships no binaries) and nothing supplied."""
    out = tier({"IMAGE_MODE_AGENT_KIT": str(fake_kit(tmp_path))})
    assert out.returncode == 2, out.stderr
    assert out.stdout.splitlines() == [
        "conformance: not run (no kube-apiserver: set KIT_BIN or KUBEBUILDER_ASSETS)"
    ]
    assert "kube-apiserver: not found" in out.stderr
    assert "machine-config-controller: not found" in out.stderr


def test_tier_without_the_kit_is_not_run(tmp_path: Path) -> None:
    out = tier({"IMAGE_MODE_AGENT_KIT": str(tmp_path / "nowhere")})
    assert out.returncode == 2
    assert out.stdout.startswith("conformance: not run (IMAGE_MODE_AGENT_KIT=")
    assert "is not a conformance kit (no cluster-up, mcc-up, unpack, crds)" in out.stdout


def test_tier_without_the_controller_lists_its_tests_as_not_run(tmp_path: Path) -> None:
    """With a cluster's binaries (fakes: none of these tests starts one) and no controller, every
    test of tests/conformance/test_mcc.py is listed as not run, by name and reason, and nothing
    fails."""
    env = {"IMAGE_MODE_AGENT_KIT": str(fake_kit(tmp_path)),
           "KIT_BIN": str(fake_bin(tmp_path / "bin", *peers.CLUSTER))}  # fmt: skip
    out = tier(env, "-k", "test_mcc")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    not_run = [line for line in lines if line.startswith("conformance: not run: ")]
    assert len(not_run) >= 6
    assert all(line.endswith("(no machine-config-controller: set KIT_BIN to a folder that "
                             "also holds it)") for line in not_run)  # fmt: skip
    assert any("[three_nodes_roll_one_at_a_time]" in line for line in not_run)
    assert lines[-1] == "conformance: 0 passed, 0 failed"


def test_a_skip_that_is_not_a_missing_binary_counts_as_failed(tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite tests="4">'
        '<testcase classname="m" name="ok"/>'
        '<testcase classname="m" name="bad"><failure message="x"/></testcase>'
        '<testcase classname="m" name="mcc"><skipped message="not run: no machine-config-'
        'controller: set KIT_BIN"/></testcase>'
        '<testcase classname="m" name="hidden"><skipped message="flaky"/></testcase>'
        "</testsuite></testsuites>"
    )
    result = tally(report)
    assert (result.passed, result.failed) == (1, 2)
    assert result.not_run == [("m::mcc", "no machine-config-controller: set KIT_BIN")]


def closing(tmp_path: Path, logs: dict[str, str]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.xml").write_text(
        '<testsuites><testsuite tests="10" failures="1" errors="0" skipped="2"/></testsuites>'
    )
    for name, text in logs.items():
        (tmp_path / name).write_text(text)
    return subprocess.run([sys.executable, str(REPO / ".ci/total.py"), str(tmp_path), *logs],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_ci_total_counts_only_the_tiers_that_ran(tmp_path: Path) -> None:
    out = closing(tmp_path, {
        "conformance.log": "conformance: not run (no kube-apiserver: set KIT_BIN or "
                           "KUBEBUILDER_ASSETS)\n",
        "system.log": "...\nsystem: 15 passed, 0 failed\n",
        "vm.log": "vm: 3 passed, 1 failed\n",
    })  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "not counted: conformance not run (no kube-apiserver: set KIT_BIN or KUBEBUILDER_ASSETS)",
        "total: 25 passed, 2 failed",
    ]


def test_ci_total_fails_on_a_log_that_says_neither(tmp_path: Path) -> None:
    out = closing(tmp_path, {"system.log": "Traceback ...\n"})
    assert out.returncode == 1
    assert "system.log: neither a count line nor a not-run line" in out.stderr
