"""bootc as it ships (issue 24) in the system tier: the stand-in bootc speaking each release
(tests/system/guest/bootc, its `persona`), the pre-pull into a read-only /sysroot's repository,
and a tag that names a manifest list."""

from __future__ import annotations

import json
import shlex

from agent.model import bootc_caps
from standins import bootc_releases
from tests.system.follow_scenarios import (
    CHECK_INTERVAL,
    expect_boot,
    move_tag,
    settle_followed,
    start_following,
)
from tests.system.machine import Machine
from tests.system.scenarios import Scenario, bootc_status, expect, fetches, no_more_boots
from tests.system.trust_scenarios import KEY, POLICY, REGISTRIES_D, policies, signed_images
from tests.system.world import MULTI, Image, World

REPO = bootc_caps.REPO  # /sysroot/ostree/repo: where bootc's pull and the agent's pre-pull write
# Capability field -> the release feature that gives it (standins/bootc_releases.py).
CAPS_FEATURES = {
    "switch_download_only": "switch-download-only",
    "upgrade_download_only": "upgrade-download-only",
    "switch_from_downloaded": "switch-from-downloaded",
    "upgrade_from_downloaded": "upgrade-from-downloaded",
    "upgrade_tag": "upgrade-tag",
    "soft_reboot": "soft-reboot",
    "sigpolicy": "switch-sigpolicy",
    "image_pull": "internals-image-pull",
}
# A flag line that clap refuses before `--help` where the release lacks the flag
# (docs/bootc-releases.md §12).
FLAG_PROBES = (
    ("switch", "--download-only", "switch-download-only"),
    ("switch", "--from-downloaded", "switch-from-downloaded"),
    ("upgrade", "--download-only", "upgrade-download-only"),
    ("upgrade", "--from-downloaded", "upgrade-from-downloaded"),
    ("upgrade", "--tag stable", "upgrade-tag"),
    ("upgrade", "--soft-reboot auto", "soft-reboot"),
    ("rollback", "--soft-reboot auto", "soft-reboot"),
)


def stored(m: Machine) -> list[str]:
    out = m.sh(f"bootc internals ostree-container image list --repo {REPO}").stdout
    return out.split()


def sysroot_readonly(m: Machine) -> bool:
    return m.sh("findmnt -no OPTIONS /sysroot").stdout.split(",")[0] == "ro"


def signed_pull(image: Image) -> str:
    return shlex.join(bootc_caps.pull_argv("bootc", image.pinned, signed=True))


def persona_cli(m: Machine, version: str) -> None:
    """One release's CLI as the agent reads it: the capabilities the agent's own parser finds
    in `--help` are that release's features; clap refuses each missing flag with exit 2 before a
    later `--help`; status has its keys only from the release that added them."""
    features = bootc_releases.features_of(version)

    def bootc(args: str) -> tuple[int, str, str]:
        r = m.sh(f"STANDIN_BOOTC_VERSION={version} bootc {args}", check=False)
        return r.returncode, r.stdout, r.stderr

    rc, out, _ = bootc("--version")
    expect(rc == 0 and out.strip() == f"bootc {version}", f"{version}: --version said {out!r}")
    helps = {verb: bootc(f"{verb} --help") for verb in ("switch", "upgrade")}
    expect(all(h[0] == 0 for h in helps.values()), f"{version}: --help failed: {helps}")
    progress = bootc("switch --progress-fd 3 --help")[0] == 0
    pull = bootc("internals ostree-container image pull --help")[0] == 0
    caps = bootc_caps.from_help(
        helps["switch"][1],
        helps["upgrade"][1],
        progress_fd=progress,
        image_pull=pull,
        lock_finalization=False,
        version=version,
    )
    got = {name: getattr(caps, name) for name in CAPS_FEATURES}
    want = {name: feature in features for name, feature in CAPS_FEATURES.items()}
    expect(got == want, f"{version}: capabilities from --help {got}, the release has {want}")
    expect(caps.progress_fd, f"{version}: the hidden --progress-fd is refused")
    for verb, flag, feature in FLAG_PROBES:
        rc, _, err = bootc(f"{verb} {flag} --help")
        if feature in features:
            expect(rc == 0, f"{version}: `{verb} {flag} --help` exited {rc}: {err}")
        else:
            expect(
                rc == 2 and "unexpected argument" in err,
                f"{version}: `{verb} {flag}` was not refused by clap: {rc} {err}",
            )
    rc, out, err = bootc("status --format json --format-version 1")
    expect(rc == 0, f"{version}: status failed: {err}")
    booted = json.loads(out)["status"]["booted"]
    for key, feature in (
        ("softRebootCapable", "status-soft-reboot-capable"),
        ("downloadOnly", "status-download-only"),
    ):
        expect(
            (key in booted) == (feature in features),
            f"{version}: status key {key} {'missing' if key not in booted else 'present'}",
        )


def platform_personas(w: World, m: Machine) -> None:
    """No agent. Every release's CLI (--version, the capabilities the agent's parser reads from
    --help, clap's exit 2 for a missing flag, status keys); then, as bootc 1.12.0: /sysroot is
    read-only, so the hidden pull without a remount fails with EROFS; with the agent's argv
    (private mount namespace, remount) it stores v2 and stages nothing, and /sysroot stays
    read-only outside; a second pull fetches nothing; `switch` of the same NAME@D contacts no
    registry (fetched.log: 0 bytes) while a pre-pulled v3 is pruned by that stage and fetched
    again after; the signed form is refused under an accept-anything default, rejects an unsigned
    image under `reject` and verifies nothing for an image already stored, and under a policy
    wanting the trusted key (real GPG signatures, the trust scenarios') admits the image that key
    signed and refuses another key's; `upgrade --check --tag` of a manifest list as 1.16.10
    names the amd64 instance, and 1.12.0 refuses --tag."""
    v1, v2, v3 = w.images["v1"], w.images["v2"], w.images["v3"]
    w.boot_into(m, v1)
    m.start()
    m.wait_booted(1)
    m.wait_system_up()
    for version in bootc_releases.PERSONAS:
        persona_cli(m, version)

    # The machine's own persona (its state dir's `persona` file).
    expect(m.sh("bootc --version").stdout.strip() == f"bootc {m.persona}", "persona file ignored")
    expect(sysroot_readonly(m), "/sysroot is not read-only in the machine")
    plain = m.sh(
        f"bootc internals ostree-container image pull --quiet {REPO} "
        f"ostree-unverified-registry:{v2.pinned}",
        check=False,
    )
    expect(
        plain.returncode == 1 and "read-only file system" in plain.stderr.lower(),
        f"a pull without the remount did not fail on the read-only /sysroot: {plain}",
    )
    prepull = shlex.join(bootc_caps.pull_argv("bootc", v2.pinned, signed=False))
    m.sh(prepull)
    expect(sysroot_readonly(m), "the pre-pull's remount leaked out of its mount namespace")
    expect(bootc_caps.listed("\n".join(stored(m)), v2.pinned), f"v2 not stored: {stored(m)}")
    expect(bootc_status(m)["status"]["staged"] is None, "the pre-pull staged something")
    last = fetches(m)[-1]
    expect(last["verb"] == "pull" and last["registry"] and last["bytes"] > 0, f"pull: {last}")
    m.sh(prepull)
    last = fetches(m)[-1]
    expect(not last["registry"] and last["bytes"] == 0, f"a second pull fetched again: {last}")

    m.sh(shlex.join(bootc_caps.pull_argv("bootc", v3.pinned, signed=False)))
    m.sh(f"bootc switch --transport registry {v2.pinned}")
    turn = fetches(m)[-1]
    expect(turn["verb"] == "switch" and turn["ref"] == v2.pinned, f"no switch fetch: {turn}")
    expect(not turn["registry"] and turn["bytes"] == 0, f"the switch went to the registry: {turn}")
    staged = bootc_status(m)["status"]["staged"]
    expect(staged and staged["image"]["imageDigest"] == v2.digest, f"v2 not staged: {staged}")
    kept = stored(m)
    expect(not bootc_caps.listed("\n".join(kept), v3.pinned), f"the stage kept v3: {kept}")
    expect({f"docker://{v1.pinned}", f"docker://{v2.pinned}"} <= set(kept), f"stored: {kept}")
    m.sh(f"bootc switch {v3.pinned}")
    again = fetches(m)[-1]
    expect(again["registry"] and again["bytes"] > 0, f"v3 was not fetched again: {again}")

    # Signed: verified against the host's policy, as `switch --enforce-container-sigpolicy`.
    signed = shlex.join(bootc_caps.pull_argv("bootc", v2.pinned, signed=True))
    insecure = m.sh(signed, check=False)
    expect(
        insecure.returncode == 1 and "insecureAcceptAnything" in insecure.stderr,
        f"a signed pull under an accept-anything default was not refused: {insecure}",
    )
    original = m.read(POLICY) or ""
    m.write(POLICY, json.dumps({"default": [{"type": "reject"}]}))
    try:
        rejected = m.sh(signed, check=False)  # v2: pruned by the last stage, fetched again
        present = m.sh(signed.replace(v2.pinned, v3.pinned), check=False)  # v3: staged
    finally:
        m.write(POLICY, original)
    expect(
        rejected.returncode == 1 and "rejected" in rejected.stderr.lower(),
        f"a signed pull of an unsigned image under `reject` passed: {rejected}",
    )
    # An image already stored is not verified again (docs/bootc-releases.md §7): why the agent
    # pre-pulls signed when the stage enforces, and prunes an unverified copy first.
    expect(
        present.returncode == 0 and not fetches(m)[-1]["registry"],
        f"a signed pull of a stored image went to the registry: {present}",
    )

    # Real signatures (the trust scenarios' keys and lookaside): under a policy that wants the
    # trusted key for the OS repository, the signed pull admits the image it signed and
    # refuses the one another key signed.
    signed, strict = signed_images(w), policies(w)["strict"]
    m.write(POLICY, json.dumps(strict))
    assert w.registry is not None
    m.write(REGISTRIES_D, f"docker:\n  {w.registry.host}:\n    sigstore: {signed.lookaside}\n")
    m.path(KEY).parent.mkdir(parents=True, exist_ok=True)
    m.path(KEY).write_bytes(signed.trusted_key)
    try:
        trusted = m.sh(signed_pull(signed.images["trusted"]), check=False)
        other = m.sh(signed_pull(signed.images["other"]), check=False)
    finally:
        m.write(POLICY, original)
    pulled = [f for f in fetches(m) if f["ref"] == signed.images["trusted"].pinned]
    expect(trusted.returncode == 0 and pulled and pulled[-1]["registry"],
           f"the signed pull of the trusted image failed: {trusted}")  # fmt: skip
    expect(other.returncode == 1 and "Invalid GPG signature" in other.stderr,
           f"the signed pull of another key's image passed: {other}")  # fmt: skip

    multi, amd64 = w.images[MULTI], w.images[f"{MULTI}-amd64"]
    check = m.sh("STANDIN_BOOTC_VERSION=1.16.10 bootc upgrade --check --tag multi").stdout
    expect(
        f"  Digest: {amd64.digest}" in check,
        f"`upgrade --check --tag {MULTI}` does not name the amd64 instance "
        f"{amd64.digest} (index {multi.digest}): {check}",
    )
    refused = m.sh("bootc upgrade --check --tag multi", check=False)
    expect(refused.returncode == 2, f"1.12.0 took --tag: {refused}")
    m.stop()


def follow_manifest_list(w: World, m: Machine) -> None:
    """bootc 1.12.0 (no `upgrade --tag`): the agent follows `stable` moved to a two-platform OCI
    index (pushed with `skopeo copy --all`) by resolving it with skopeo itself; the digest it
    follows, and boots with one reboot, is the index's linux/amd64 instance, and equals the
    `Digest:` that bootc 1.16.10's `upgrade --check --tag stable` prints on the same machine."""
    multi, amd64 = w.images[MULTI], w.images[f"{MULTI}-amd64"]
    start_following(w, m, '[updates]\nstrategy = "immediate"\n')
    move_tag(w, multi)  # the tag now names the index, not an image
    expect_boot(m, 2, "booted-staged", amd64)
    status = settle_followed(m, amd64)
    followed = (status.get("follow") or {}).get("latestDigest")
    check = m.sh("STANDIN_BOOTC_VERSION=1.16.10 bootc upgrade --check --tag stable").stdout
    reported = next((line.split()[-1] for line in check.splitlines() if "Digest:" in line), None)
    expect(
        followed == reported == amd64.digest,
        f"the agent follows {followed}, bootc 1.16.10 reports {reported}, the amd64 "
        f"instance is {amd64.digest} (the index {multi.digest})",
    )
    no_more_boots(m, 2, seconds=3 * CHECK_INTERVAL)


PERSONA_SCENARIOS = [
    Scenario(
        "platform-personas",
        platform_personas,
        needs_agent=False,
        doc=platform_personas.__doc__ or "",
        persona="1.12.0",
    ),
    Scenario(
        "follow-manifest-list-1.12.0",
        follow_manifest_list,
        doc=follow_manifest_list.__doc__ or "",
        persona="1.12.0",
    ),
]
