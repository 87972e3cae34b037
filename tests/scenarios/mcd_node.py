"""A host as Ignition and the machine-config-daemon leave it, and a snapshot that proves nothing
on it was written: shared by the takeover tests (tests/test_takeover.py), the cluster scenario
that runs on both API servers (tests/scenarios/cluster.py), the first start after provisioning
(tests/test_provisioned_first_start.py) and the pool scenarios' hosts on either controller
(tests/scenarios/pool.py).

What the MCD leaves (docs/mco-protocol.md §8-9; MCO daemon.go
`storeCurrentConfigOnDisk`, update.go `updateSSHKeys`): `/etc/machine-config-daemon/currentconfig`
(its json.Marshal of the rendered config, 0644), `currentimage` (empty when not layered), the
machine-config-server's `node-annotations.json` renamed `node-annotation.json.bak` after the
first boot, core's keys in `authorized_keys.d/ignition` (0600, core's, directories 0700), and
the files of the config's live part (the pull secret): `prepare`.

What provisioning leaves, before any daemon ran (`provision`): the Ignition config the
machine-config-server serves for a rendered config (`served_config`: the config, then what
the server appends, pkg/server/cluster_server.go `GetConfig` and server.go at
https://github.com/openshift/machine-config-operator/tree/7ff337a4ffac8e7562692181178ede61e4b2eec5/pkg/server),
laid out as Ignition's files stage does (`lay_ignition`), then the first boot's
machine-config-daemon-firstboot.service on a host already booted on the config's osImageURL
(nothing to update: it removes the encapsulated config, pkg/daemon/daemon.go:1279-1286 at the commit
above). The units a config enables without giving their contents come from the OS image: a host's
images must ship them (`image_units`, `OS_UNITS`), or provisioning fails here as `systemctl enable`
would."""

from __future__ import annotations

import base64
import copy
import gzip
import hashlib
import json
import os
import stat
import urllib.parse
from pathlib import Path
from typing import Any

import yaml

from agent.core.policy import CLOUD_CA, KUBECONFIG, KUBELET_CA, SSH_KEYS_PATH
from agent.model.mcd_disk import CURRENT_CONFIG_PATH, CURRENT_IMAGE_PATH, on_disk_config

STATE_DIR = "var/lib/image-mode-agent"
P = "machineconfiguration.openshift.io/"


def done_annotations(config: str) -> dict[str, str]:
    """The Node as the MCD leaves it after `config`: Done, the last drain answered."""
    return {P + "currentConfig": config, P + "desiredConfig": config, P + "state": "Done",
            P + "reason": "", P + "desiredDrain": f"uncordon-{config}",
            P + "lastAppliedDrain": f"uncordon-{config}"}  # fmt: skip


def write(root: Path, path: str, data: str | bytes, mode: int, uid: int = 0,
          gid: int | None = None) -> None:  # fmt: skip
    """A file under `root`, its mode and owner (the group `uid`'s own unless given)."""
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data.encode() if isinstance(data, str) else data)
    target.chmod(mode)
    os.chown(target, uid, uid if gid is None else gid)


def prepare(root: Path, rendered: dict[str, Any], keys: list[str], *, image: str = "",
            files: dict[str, str] | None = None) -> None:  # fmt: skip
    """`root` as the MCD leaves it after applying `rendered` (the API server's object, or
    the document it was created from); `files`: the live part's other files (path -> text)."""
    name = rendered["metadata"]["name"]
    write(root, CURRENT_CONFIG_PATH, on_disk_config(rendered), 0o644)
    write(root, CURRENT_IMAGE_PATH, image, 0o644)
    seeded = {P + "currentConfig": name, P + "desiredConfig": name,
              P + "firstPivotConfig": name, P + "state": "Done"}  # fmt: skip
    write(root, "/etc/machine-config-daemon/node-annotation.json.bak", json.dumps(seeded), 0o644)
    for folder in ("var/home/core/.ssh", "var/home/core/.ssh/authorized_keys.d"):
        (root / folder).mkdir(mode=0o700, exist_ok=True)
        (root / folder).chmod(0o700)
        os.chown(root / folder, 1000, 1000)
    write(root, SSH_KEYS_PATH, "".join(f"{key}\n" for key in keys), 0o600, uid=1000)
    for path, text in (files or {}).items():
        write(root, path, text, 0o600)


# What `entry` records, by kind.
DIR_FIELDS = ("mode", "uid", "gid")
FILE_FIELDS = (*DIR_FIELDS, "size", "inode", "mtime", "ctime", "content")


def entry(path: Path) -> tuple:
    """One entry as a snapshot records it: type and mode, owner, and for a file or a link its
    size, inode, mtime, ctime and contents (a sha256; a link's target). A directory's own
    times and inode are left out: they move with any entry created, renamed or removed in it,
    and each of those is an entry of its own."""
    info = path.lstat()
    owner = (info.st_mode, info.st_uid, info.st_gid)
    if stat.S_ISDIR(info.st_mode):
        return owner
    if stat.S_ISLNK(info.st_mode):
        content = os.readlink(path)
    elif stat.S_ISREG(info.st_mode):
        content = hashlib.sha256(path.read_bytes()).hexdigest()
    else:
        content = ""
    return (*owner, info.st_size, info.st_ino, info.st_mtime_ns, info.st_ctime_ns, content)


def snapshot(root: Path, skip: tuple[str, ...] = (STATE_DIR,)) -> dict[str, tuple]:
    """Every entry under `root` but those in the folders `skip` names (the agent's own state
    by default). Equal snapshots: nothing written, not even the same bytes again (an atomic
    write replaces the inode; a chmod or chown moves the ctime)."""
    found: dict[str, tuple] = {}
    for folder, dirs, files in os.walk(root):
        rel_folder = Path(folder).relative_to(root)
        dirs[:] = [d for d in dirs if str(rel_folder / d) not in skip]
        for name in (*dirs, *files):
            found[str(rel_folder / name)] = entry(Path(folder) / name)
    return found


def changed(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    """The paths `snapshot` saw created, changed or removed between two snapshots."""
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


# -- provisioning: the machine-config-server's config, laid out as Ignition does ---------------

NODE_ANNOTATIONS = "/etc/machine-config-daemon/node-annotations.json"
MCS_CONTENT = "/etc/mcs-machine-config-content.json"
ENCAPSULATED = "/etc/ignition-machine-config-encapsulated.json"
IGNITION_PRESET = "/etc/systemd/system-preset/20-ignition.preset"
UNIT_DIR = "/etc/systemd/system"
IMAGE_UNIT_DIR = "/usr/lib/systemd/system"
# systemd's unit search path (lookup-paths.c), as standins/host/unit_files.py reads it.
_UNIT_PATHS = (UNIT_DIR, "/run/systemd/system", IMAGE_UNIT_DIR, "/lib/systemd/system")
_INSTALL_LINKS = {"WantedBy": ".wants", "RequiredBy": ".requires", "UpheldBy": ".upholds"}
_FIRST_UID = 1001  # useradd's next id on a host whose only user is core (1000)

# What an RHCOS image ships under /usr/lib/systemd/system for the units the MCO's templates
# configure without contents (templates/common/_base/units/ at 7ff337a4: openvswitch.service
# and ovsdb-server.service enabled on OVNKubernetes; drop-ins only for the others). Plausible
# stand-ins, not the packages' files: what matters is that each exists, with an [Install]
# section where the config enables it, so `systemctl enable` (and is-enabled) finds it.
OS_UNITS: dict[str, str] = {
    f"usr/lib/systemd/system/{name}": text
    for name, text in {
        "openvswitch.service": "[Unit]\nDescription=Open vSwitch\nRequires=ovsdb-server.service"
        " ovs-vswitchd.service\nAfter=ovsdb-server.service ovs-vswitchd.service\n\n[Service]\n"
        "Type=oneshot\nExecStart=/bin/true\nRemainAfterExit=yes\n\n[Install]\n"
        "WantedBy=multi-user.target\n",
        "ovsdb-server.service": "[Unit]\nDescription=Open vSwitch Database Unit\n"
        "PartOf=openvswitch.service\n\n[Service]\nType=forking\nExecStart=/usr/share/"
        "openvswitch/scripts/ovs-ctl --no-ovs-vswitchd start\n\n[Install]\n"
        "WantedBy=multi-user.target\n",
        "ovs-vswitchd.service": "[Unit]\nDescription=Open vSwitch Forwarding Unit\n"
        "Requires=ovsdb-server.service\nPartOf=openvswitch.service\n\n[Service]\nType=forking\n"
        "ExecStart=/usr/share/openvswitch/scripts/ovs-ctl --no-ovsdb-server start\n",
        "openvswitch-ipsec.service": "[Unit]\nDescription=OVS IPsec daemon\n"
        "Requires=openvswitch.service\n\n[Service]\nType=forking\nExecStart=/usr/share/"
        "openvswitch/scripts/ovs-ctl start-ovs-ipsec\n\n[Install]\nWantedBy=multi-user.target\n",
        "ipsec.service": "[Unit]\nDescription=Internet Key Exchange (IKE) Protocol Daemon for "
        "IPsec\n\n[Service]\nType=notify\nExecStart=/usr/libexec/ipsec/pluto --leak-detective "
        "--config /etc/ipsec.conf --nofork\n\n[Install]\nWantedBy=multi-user.target\n",
        "crio.service": "[Unit]\nDescription=Container Runtime Interface for OCI (CRI-O)\n"
        "Wants=network-online.target\nAfter=network-online.target\n\n[Service]\nType=notify\n"
        "ExecStart=/usr/bin/crio\n\n[Install]\nWantedBy=multi-user.target\n",
        "chrony-wait.service": "[Unit]\nDescription=Wait for chrony to synchronize system clock\n"
        "After=chronyd.service\nRequires=chronyd.service\nBefore=time-sync.target\n\n[Service]\n"
        "Type=oneshot\nExecStart=/usr/bin/chronyc waitsync 180 0.1 0.0 1\nRemainAfterExit=yes\n"
        "\n[Install]\nWantedBy=multi-user.target\n",
        "rpm-ostreed.service": "[Unit]\nDescription=rpm-ostree System Management Daemon\n\n"
        "[Service]\nType=dbus\nBusName=org.projectatomic.rpmostree1\n"
        "ExecStart=/usr/bin/rpm-ostree start-daemon\n",
    }.items()
}


class NotProvisionable(Exception):
    """Provisioning would fail here: Ignition refuses the config, or systemd cannot enable a
    unit the config enables."""


def image_units(rendered: dict[str, Any] | None = None) -> dict[str, str]:
    """The unit files (path under the root -> text) an OS image must ship for `rendered`:
    OS_UNITS, and a plausible one with an [Install] section for every other unit the config
    enables or disables without giving its contents. For an image made before its config is
    known (a pool's hosts, booted before the controller renders), OS_UNITS alone."""
    shipped = dict(OS_UNITS)
    config = ((rendered or {}).get("spec") or {}).get("config") or {}
    for unit in (config.get("systemd") or {}).get("units") or []:
        rel = f"usr/lib/systemd/system/{unit['name']}"
        if unit.get("contents") or unit.get("enabled") is None or rel in shipped:
            continue
        shipped[rel] = (f"[Unit]\nDescription={unit['name']} (shipped by the OS image)\n\n"
                        "[Service]\nType=oneshot\nExecStart=/bin/true\n\n"
                        "[Install]\nWantedBy=multi-user.target\n")  # fmt: skip
    return shipped


def _data(text: str | bytes) -> str:
    """A data URL of `text`, percent-encoded, as the server's getEncodedContent writes one."""
    raw = text.encode() if isinstance(text, str) else text
    return "data:," + urllib.parse.quote(raw, safe="")


def _append_file(files: list[dict[str, Any]], path: str, contents: str | bytes) -> None:
    """server.go appendFileToIgnition: mode 420, overwrite, a data URL."""
    files.append({"path": path, "mode": 0o644, "overwrite": True,
                  "contents": {"source": _data(contents)}})  # fmt: skip


def _bootstrap_kubeconfig(cc_spec: dict[str, Any]) -> str:
    """What `kubeconfigFromSecret` serves: the API server's internal URL, the CA bundle, the
    bootstrap token (a placeholder here: nothing on a simulated host uses it)."""
    infra = ((cc_spec.get("infra") or {}).get("status") or {}).get("apiServerInternalURI", "")
    ca = cc_spec.get("rootCAData") or cc_spec.get("kubeAPIServerServingCAData") or ""
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kubelet",
        "clusters": [{"name": "local", "cluster": {
            "server": infra or "https://api-int.example.invalid:6443",
            "certificate-authority-data": ca}}],
        "contexts": [{"name": "kubelet", "context": {"cluster": "local", "user": "kubelet"}}],
        "users": [{"name": "kubelet", "user": {"token": "bootstrap-token-placeholder"}}],
    })  # fmt: skip


def served_config(rendered: dict[str, Any], controller_config: dict[str, Any] | None = None, *,
                  image: str = "", kubeconfig: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The Ignition config the machine-config-server serves a new node of `rendered`'s pool
    (cluster_server.go GetConfig): the rendered config; the kubelet and cloud CAs of the
    ControllerConfig in place (addDataAndMaybeAppendToIgnition); node-annotations.json (the
    rendered config current, desired and first pivot, Done; `image` as current and desired
    image when layered); the bootstrap kubeconfig; the served MachineConfig as
    mcs-machine-config-content.json; last, the encapsulated MachineConfig (its Ignition empty)."""
    config = copy.deepcopy(rendered["spec"]["config"])
    files: list[dict[str, Any]] = config.setdefault("storage", {}).setdefault("files", [])
    cc_spec = (controller_config or {}).get("spec") or {}
    for path, key in ((KUBELET_CA, "kubeAPIServerServingCAData"),
                      (CLOUD_CA, "cloudProviderCAData")):  # fmt: skip
        data = base64.b64decode(cc_spec.get(key) or "")
        if not data:
            continue
        same = [f for f in files if f["path"] == path]
        if same:
            same[0]["contents"] = {**same[0].get("contents", {}), "source": _data(data)}
        else:
            _append_file(files, path, data)
    name = rendered["metadata"]["name"]
    seeded = {P + "currentConfig": name, P + "desiredConfig": name,
              P + "firstPivotConfig": name, P + "state": "Done"}  # fmt: skip
    if image:
        seeded.update({P + "currentImage": image, P + "desiredImage": image})
    # Go's json.Marshal of a map: keys sorted, no spaces.
    _append_file(files, NODE_ANNOTATIONS, json.dumps(seeded, sort_keys=True, separators=(",", ":")))
    _append_file(files, KUBECONFIG, kubeconfig or _bootstrap_kubeconfig(cc_spec))
    _append_file(files, MCS_CONTENT, json.dumps(rendered, indent=4))
    encapsulated = {**rendered, "spec": {**rendered["spec"],
                                         "config": {"ignition": {"version": "3.5.0"}}}}  # fmt: skip
    _append_file(files, ENCAPSULATED, json.dumps(encapsulated, separators=(",", ":")))
    return config


def provision(root: Path, rendered: dict[str, Any], controller_config: dict[str, Any] | None = None,
              *, image: str = "", kubeconfig: str | None = None) -> None:  # fmt: skip
    """`root` as a node provisioned from `rendered` is when its daemon first starts: the
    served config (`served_config`) laid out by Ignition (`lay_ignition`), then the first
    boot's machine-config-daemon-firstboot.service on a host booted on the config's
    osImageURL (the caller's to arrange: `image_units` for what the image ships): nothing to
    update, so `firstboot-complete-machineconfig` removes the encapsulated config and leaves
    the rest (daemon.go RunFirstbootCompleteMachineconfig)."""
    usr_local = root / "usr/local"
    if not usr_local.exists() and not usr_local.is_symlink():
        # ostree's layout, as on every RHCOS host: /usr is the image's, /usr/local a link into
        # /var, where Ignition's /usr/local/bin files land.
        (root / "var/usrlocal").mkdir(parents=True, exist_ok=True)
        usr_local.parent.mkdir(parents=True, exist_ok=True)
        usr_local.symlink_to("../var/usrlocal")
    lay_ignition(root, served_config(rendered, controller_config, image=image,
                                     kubeconfig=kubeconfig))  # fmt: skip
    (root / ENCAPSULATED.lstrip("/")).unlink()


# -- Ignition's files stage -----------------------------------------------------------------


def _source(contents: dict[str, Any], where: str) -> bytes:
    """A resource's bytes: a data URL (RFC 2397, percent-encoded or base64), gunzipped when
    `compression` says gzip. Remote sources are not modelled."""
    source = contents.get("source")
    if source is None:
        return b""
    if not source.startswith("data:"):
        raise NotProvisionable(f"{where}: only data URLs are modelled, not {source[:20]!r}")
    header, _, payload = source[5:].partition(",")
    data = urllib.parse.unquote_to_bytes(payload)
    if header.split(";")[-1] == "base64":
        data = base64.b64decode(data)
    compression = contents.get("compression") or ""
    if compression == "gzip":
        return gzip.decompress(data)
    if compression:
        raise NotProvisionable(f"{where}: compression {compression!r}")
    return data


def _ids(root: Path, table: str) -> dict[str, int]:
    """name -> id from the host's /etc/passwd or /etc/group."""
    lines = (root / "etc" / table).read_text().splitlines()
    return {f[0]: int(f[2]) for f in (line.split(":") for line in lines) if len(f) > 2}


def _owner(root: Path, node: dict[str, Any], where: str) -> tuple[int, int]:
    """A node's user and group as numeric ids (Ignition resolves names on the target root and
    fails on one it does not know); root:root when unset."""
    found = []
    for key, table in (("user", "passwd"), ("group", "group")):
        spec = node.get(key) or {}
        if spec.get("id") is not None:
            found.append(int(spec["id"]))
        elif spec.get("name"):
            ids = _ids(root, table)
            if spec["name"] not in ids:
                raise NotProvisionable(f"{where}: no {key} {spec['name']!r} in /etc/{table}")
            found.append(ids[spec["name"]])
        else:
            found.append(0)
    return found[0], found[1]


def _mkdirs(root: Path, path: str) -> None:
    """The missing parents of `path`, 0755 root:root, as Ignition creates them."""
    missing = []
    parent = (root / path.lstrip("/")).parent
    while not parent.exists() and not parent.is_symlink():
        missing.append(parent)
        parent = parent.parent
    for folder in reversed(missing):
        folder.mkdir(mode=0o755)
        folder.chmod(0o755)


def _lay_file(root: Path, file: dict[str, Any]) -> None:
    path = file["path"]
    target = root / path.lstrip("/")
    if target.exists() and file.get("overwrite") is False:
        raise NotProvisionable(f"{path}: exists and overwrite is false")
    data = _source(file.get("contents") or {}, path)
    data += b"".join(_source(extra, path) for extra in file.get("append") or [])
    uid, gid = _owner(root, file, path)
    _mkdirs(root, path)
    if target.is_symlink() or target.exists():
        target.unlink()
    write(root, path, data, file.get("mode", 0o644), uid=uid, gid=gid)


def _lay_directory(root: Path, directory: dict[str, Any]) -> None:
    path = directory["path"]
    uid, gid = _owner(root, directory, path)
    _mkdirs(root, path + "/x")
    target = root / path.lstrip("/")
    target.mkdir(exist_ok=True)
    target.chmod(directory.get("mode", 0o755))
    os.chown(target, uid, gid)


def _lay_link(root: Path, link: dict[str, Any]) -> None:
    if link.get("hard"):
        raise NotProvisionable(f"{link['path']}: hard links are not modelled")
    target = root / link["path"].lstrip("/")
    _mkdirs(root, link["path"])
    if target.is_symlink() or target.exists():
        target.unlink()
    target.symlink_to(link["target"])
    uid, gid = _owner(root, link, link["path"])
    os.chown(target, uid, gid, follow_symlinks=False)


def _add_group(root: Path, group: dict[str, Any]) -> None:
    """groupadd: a line in /etc/group (the next free id unless given)."""
    groups = _ids(root, "group")
    if group["name"] in groups:
        return
    gid = group.get("gid") or max([_FIRST_UID - 1, *groups.values()]) + 1
    with open(root / "etc/group", "a") as handle:
        handle.write(f"{group['name']}:x:{gid}:\n")


def _add_user(root: Path, user: dict[str, Any]) -> None:
    """useradd for a user the host lacks (its own group, a home under /var/home; the password
    locked), then the user's SSH keys in ~/.ssh/authorized_keys.d/ignition, as Ignition writes
    them (the directories 0700, the file 0600, all the user's)."""
    name = user["name"]
    users = _ids(root, "passwd")
    if name in users and user.get("passwordHash"):  # usermod --password
        shadow = root / "etc/shadow"
        lines = [f"{name}:{user['passwordHash']}:{line.split(':', 2)[2]}"
                 if line.split(":")[0] == name else line
                 for line in shadow.read_text().splitlines()]  # fmt: skip
        shadow.write_text("".join(f"{line}\n" for line in lines))
    if name not in users:
        uid = user.get("uid") or max([_FIRST_UID - 1, *users.values()]) + 1
        _add_group(root, {"name": name, "gid": uid})
        home = user.get("homeDir") or f"/home/{name}"
        with open(root / "etc/passwd", "a") as handle:
            handle.write(f"{name}:x:{uid}:{uid}::{home}:/bin/bash\n")
        with open(root / "etc/shadow", "a") as handle:
            handle.write(f"{name}:{user.get('passwordHash') or '!!'}:19000:0:99999:7:::\n")
        (root / home.lstrip("/")).mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chown(root / home.lstrip("/"), uid, uid)
    keys = user.get("sshAuthorizedKeys") or []
    if not keys:
        return
    uid = _ids(root, "passwd")[name]
    gid = _ids(root, "group").get(name, uid)
    home = next(line.split(":")[5] for line in (root / "etc/passwd").read_text().splitlines()
                if line.split(":")[0] == name)  # fmt: skip
    for folder in (f"{home}/.ssh", f"{home}/.ssh/authorized_keys.d"):
        path = root / folder.lstrip("/")
        path.mkdir(mode=0o700, exist_ok=True)
        path.chmod(0o700)
        os.chown(path, uid, gid)
    keys_path = f"{home}/.ssh/authorized_keys.d/ignition"
    write(root, keys_path, "".join(f"{key}\n" for key in keys), 0o600, uid=uid, gid=gid)


def _unit_file(root: Path, name: str) -> str | None:
    """Where systemd finds unit `name` (an instance falls back to its template), or None."""
    candidates = [name]
    if "@" in name:
        stem, _, suffix = name.rpartition(".")
        candidates.append(stem.split("@", 1)[0] + "@." + suffix)
    for folder in _UNIT_PATHS:
        for candidate in candidates:
            path = f"{folder}/{candidate}"
            if (root / path.lstrip("/")).is_file():
                return path
    return None


def _install_section(text: str) -> dict[str, list[str]]:
    """The [Install] section's settings, each a list of the names it gives."""
    found: dict[str, list[str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Install]" and "=" in line:
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).extend(value.split())
    return found


def _enable(root: Path, name: str, seen: set[str]) -> None:
    """The links `systemctl enable NAME` writes (install.c): for each WantedBy=, RequiredBy=
    and UpheldBy= unit a `.wants/`, `.requires/` or `.upholds/` link in /etc/systemd/system to
    the unit file, an Alias= link, and the units of Also= enabled too. A unit with no
    [Install] settings is static: nothing is written."""
    if name in seen:
        return
    seen.add(name)
    path = _unit_file(root, name)
    if path is None:
        raise NotProvisionable(
            f"{name}: enabled by the config, which gives no contents for it, and the OS image "
            f"ships none ({IMAGE_UNIT_DIR}/{name}): `systemctl enable` fails. Put it into the "
            "simulated host's images (tests/scenarios/mcd_node.py image_units, OS_UNITS)"
        )
    install = _install_section((root / path.lstrip("/")).read_text())
    for key, suffix in _INSTALL_LINKS.items():
        for wanted_by in install.get(key, []):
            _link(root, f"{UNIT_DIR}/{wanted_by}{suffix}/{name}", path)
    for alias in install.get("Alias", []):
        _link(root, f"{UNIT_DIR}/{alias}", path)
    for also in install.get("Also", []):
        _enable(root, also, seen)


def _link(root: Path, path: str, target: str) -> None:
    link = root / path.lstrip("/")
    _mkdirs(root, path)
    if not link.is_symlink():
        link.symlink_to(target)


def _lay_units(root: Path, units: list[dict[str, Any]]) -> None:
    """Ignition's createUnits: drop-ins and contents into /etc/systemd/system (0644, empty
    ones skipped), a mask as a link to /dev/null, `enabled` as a line of 20-ignition.preset;
    then the presets as systemd applies them at the first boot (`preset-all`: the links
    `systemctl enable` writes; `disable` finds none to remove on a new host)."""
    presets: list[tuple[str, str]] = []
    for unit in units:
        name = unit["name"]
        for dropin in unit.get("dropins") or []:
            if dropin.get("contents"):
                path = f"{UNIT_DIR}/{name}.d/{dropin['name']}"
                _mkdirs(root, path)
                write(root, path, dropin["contents"], 0o644)
        if unit.get("contents"):
            _mkdirs(root, f"{UNIT_DIR}/{name}")
            write(root, f"{UNIT_DIR}/{name}", unit["contents"], 0o644)
        if unit.get("mask"):
            masked = root / UNIT_DIR.lstrip("/") / name
            _mkdirs(root, f"{UNIT_DIR}/{name}")
            if masked.is_symlink() or masked.exists():
                masked.unlink()
            masked.symlink_to("/dev/null")
        if unit.get("enabled") is not None:
            presets.append(("enable" if unit["enabled"] else "disable", name))
    if not presets:
        return
    _mkdirs(root, IGNITION_PRESET)
    write(root, IGNITION_PRESET, "".join(f"{verb} {name}\n" for verb, name in presets), 0o644)
    seen: set[str] = set()
    for verb, name in presets:
        unit_path = root / UNIT_DIR.lstrip("/") / name
        masked = unit_path.is_symlink() and os.readlink(unit_path) == "/dev/null"
        if verb == "enable" and not masked:  # systemctl refuses to enable a masked unit
            _enable(root, name, seen)


def lay_ignition(root: Path, config: dict[str, Any]) -> None:
    """`config` (an Ignition 3 config) laid out under `root` as Ignition's files stage does:
    groups and users (with core's and the others' SSH keys), directories, files (contents
    decoded, mode, owner; missing parents 0755 root), links, then systemd units. The owners
    a config names must be users and groups of the host's /etc/passwd and /etc/group or of
    the config itself (NotProvisionable otherwise, as Ignition fails)."""
    passwd = config.get("passwd") or {}
    for group in passwd.get("groups") or []:
        _add_group(root, group)
    for user in passwd.get("users") or []:
        _add_user(root, user)
    storage = config.get("storage") or {}
    for directory in storage.get("directories") or []:
        _lay_directory(root, directory)
    for file in storage.get("files") or []:
        _lay_file(root, file)
    for link in storage.get("links") or []:
        _lay_link(root, link)
    _lay_units(root, (config.get("systemd") or {}).get("units") or [])
