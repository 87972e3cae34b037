"""Signed OS images with real signatures: GPG keys made here, images signed with `skopeo copy
--sign-by` into a lookaside served over HTTP on 127.0.0.1, and the machine's stand-in bootc
verifying through containers/image (`skopeo --policy`) as bootc's image proxy does, under
/etc/containers/policy.json and registries.d, which the agent writes as live content."""

from __future__ import annotations

import functools
import http.server
import json
import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from tests.builders import ign_file
from tests.system import oci
from tests.system.machine import Machine
from tests.system.scenarios import (
    AGENT_TIMEOUT,
    Scenario,
    bootc_status,
    booted_digest,
    expect,
    no_more_boots,
    settle_done,
    wait_state,
)
from tests.system.world import AGENT_ENV, Image, World, image_files

POLICY = "/etc/containers/policy.json"
REGISTRIES_D = "/etc/containers/registries.d/50-system-tier.yaml"
KEY = "/etc/machine-config-daemon/no-reboot/containers-gpg.pub"
# The NodeDisruptionPolicy status OpenShift renders for these paths ("Reload crio.service"),
# with None here: the machine has no CRI-O.
DISRUPTION_POLICY = "/etc/image-mode-agent/machineconfiguration.json"


@dataclass(frozen=True)
class Signed:
    """What the signing side made: images by trust, the trusted public key, the lookaside."""

    images: dict[str, Image]
    trusted_key: bytes
    lookaside: str  # http://127.0.0.1:PORT


def gpg(home: Path, *args: str, data: bytes | None = None) -> bytes:
    proc = subprocess.run(
        ["timeout", "60", "gpg", "--batch", "--homedir", str(home), *args],
        input=data,
        capture_output=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"gpg {' '.join(args)}: {proc.stderr.decode(errors='replace')}")
    return proc.stdout


def make_key(home: Path, name: str) -> str:
    """A new signing key without a passphrase; returns its fingerprint."""
    uid = f"image-mode-agent system tier {name} <{name}@test.invalid>"
    gpg(home, "--pinentry-mode", "loopback", "--passphrase", "", "--quick-gen-key", uid,
        "ed25519", "sign", "never")  # fmt: skip
    for line in gpg(home, "--with-colons", "--list-keys", uid).decode().splitlines():
        if line.startswith("fpr:"):
            return line.split(":")[9]
    raise RuntimeError(f"no fingerprint for {uid}")


def serve(directory: Path) -> tuple[str, http.server.ThreadingHTTPServer]:
    """A lookaside signature server on 127.0.0.1 (a web server, as lookasides are)."""
    handler = functools.partial(QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def signed_images(w: World) -> Signed:
    """A trusted and an untrusted key; s4 signed by the trusted one, s5 by the other; v2
    (pushed by the world) stays unsigned. Made once per run (the scenarios share them)."""
    if "signed" not in w.built:
        w.built["signed"] = _sign(w)
    return w.built["signed"]


def _sign(w: World) -> Signed:
    assert w.registry is not None
    base = w.workdir / "signing"
    home, sigstore, regd = base / "gnupg", base / "sigstore", base / "registries.d"
    for path in (home, sigstore, regd):
        path.mkdir(parents=True, mode=0o700, exist_ok=True)
    trusted, other = make_key(home, "trusted"), make_key(home, "other")
    (regd / "staging.yaml").write_text(
        f"docker:\n  {w.registry.host}:\n    sigstore-staging: file://{sigstore}\n"
    )
    name = w.images["v1"].name
    layout = w.workdir / "oci"
    images = {"unsigned": w.images["v2"]}
    for tag, fingerprint in (("s4", trusted), ("s5", other)):
        oci.write_image(layout, tag, tag, image_files(tag))
        digest = oci.push(layout, tag, f"{name}:{tag}")
        subprocess.run(
            ["timeout", "60", "skopeo", "--registries.d", str(regd), "copy", "--quiet",
             "--src-tls-verify=false", "--dest-tls-verify=false", "--sign-by", fingerprint,
             f"docker://{name}@{digest}", f"docker://{name}:{tag}"],
            check=True, capture_output=True, env={**os.environ, "GNUPGHOME": str(home)},
        )  # fmt: skip
        images[tag] = Image(name, tag, digest)
    url, server = serve(sigstore)
    w.cleanups.append(server.shutdown)
    return Signed(
        {"trusted": images["s4"], "other": images["s5"], "unsigned": images["unsigned"]},
        gpg(home, "--export", trusted),
        url,
    )


def trust_files(w: World, signed: Signed, policy: dict) -> list[dict]:
    assert w.registry is not None
    lookaside = f"docker:\n  {w.registry.host}:\n    sigstore: {signed.lookaside}\n"
    return [
        ign_file(POLICY, json.dumps(policy, indent=1)),
        ign_file(REGISTRIES_D, lookaside),
        ign_file(KEY, signed.trusted_key),
    ]


def policies(w: World) -> dict[str, dict]:
    """OpenShift's shape (default insecureAcceptAnything, the OS repository scoped), the same
    with a reject default, and the scope relaxed."""
    repo = w.images["v1"].name
    signed_by = [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": KEY}]
    accept = [{"type": "insecureAcceptAnything"}]
    return {
        "openshift": {"default": accept, "transports": {"docker": {repo: signed_by}}},
        "strict": {"default": [{"type": "reject"}], "transports": {"docker": {repo: signed_by}}},
        "relaxed": {"default": accept, "transports": {"docker": {repo: accept}}},
    }


def disruption_policy() -> dict:
    files = [{"path": p, "actions": [{"type": "None"}]}
             for p in (POLICY, "/etc/containers/registries.d", KEY)]  # fmt: skip
    return {
        "apiVersion": "operator.openshift.io/v1",
        "kind": "MachineConfiguration",
        "metadata": {"name": "cluster", "generation": 1},
        "status": {"observedGeneration": 1,
                   "nodeDisruptionPolicyStatus": {"clusterPolicies": {"files": files}}},
    }  # fmt: skip


def refused(m: Machine, image: Image, words: str, boots: int) -> None:
    status = wait_state(m, "Degraded", f"{image.tag} refused", reason=image.digest)
    reason = status["reason"]
    expect("refused by the signature policy" in reason, f"not a signature refusal: {reason}")
    expect(f'transports.docker["{image.name}"]' in reason, f"the scope is not named: {reason}")
    expect(words in reason, f"expected {words!r} in: {reason}")
    expect(bootc_status(m)["status"]["staged"] is None, f"{image.tag} was staged")
    expect(booted_digest(m) != image.digest, f"{image.tag} was booted")
    no_more_boots(m, boots)


def signed_images_scenario(w: World, m: Machine) -> None:
    """Under a policy that requires the trusted key for the OS repository: an unsigned image
    and one signed by another key are refused at staging (no drain, no reboot, the reason
    names the image and the scope), under a `reject` default and under OpenShift's
    insecureAcceptAnything default; the signed one updates with one reboot; a live
    policy.json change that relaxes the scope then admits the image refused before."""
    signed, policy = signed_images(w), policies(w)
    v1 = w.images["v1"]
    w.boot_into(m, v1)
    w.install_agent(m, v1)
    m.write(DISRUPTION_POLICY, json.dumps(disruption_policy(), indent=1))
    env = (m.read(AGENT_ENV) or "").rstrip()
    expect(env.endswith('"'), f"unexpected {AGENT_ENV}: {env}")
    m.write(AGENT_ENV, f'{env[:-1]} --policy {DISRUPTION_POLICY}"\n')
    m.start()
    m.wait_booted(1)
    settle_done(m, v1)

    def want(image: Image, which: str) -> None:
        files = trust_files(w, signed, policy[which])
        w.set_desired(m, image, name=f"rendered-{image.tag}-{which}", files=files)

    unsigned, other, trusted = (signed.images[k] for k in ("unsigned", "other", "trusted"))
    want(unsigned, "strict")
    refused(m, unsigned, "A signature was required, but no signature exists", boots=1)
    expect(json.loads(m.read(POLICY) or "{}") == policy["strict"],
           "the policy was not written before the stage")  # fmt: skip
    want(other, "openshift")
    refused(m, other, "Invalid GPG signature", boots=1)
    want(trusted, "openshift")
    m.wait_booted(2, AGENT_TIMEOUT)
    settle_done(m, trusted)
    expect(booted_digest(m) == trusted.digest, "the signed image is not booted")
    want(unsigned, "relaxed")
    m.wait_booted(3, AGENT_TIMEOUT)
    settle_done(m, unsigned)
    expect(json.loads(m.read(POLICY) or "{}") == policy["relaxed"], "policy not relaxed")
    no_more_boots(m, 3)


TRUST_SCENARIOS = [
    Scenario("signed-images", signed_images_scenario, doc=signed_images_scenario.__doc__ or ""),
]
