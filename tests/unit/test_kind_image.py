"""The kind node image's pure parts: names, the input digest that decides a rebuild, the node's
files and containerd config, the kube-proxy image's iptables (dpkg closure, backend wrapper)."""

from __future__ import annotations

import io
import json
import os
import re
import stat
import subprocess
import tarfile
import tomllib
from pathlib import Path

import pytest

from pykcm.testenv import images
from pykcm.testenv.errors import BuildError
from pykcm.testenv.kind import nodefiles, nodeimage, preload
from pykcm.testenv.runc import RUNC_BUILD_PACKAGES

# What `kubeadm config images list --kubernetes-version v1.36.3` printed (kubeadm built from the module).
KUBEADM_V1_36_3 = (
    "registry.k8s.io/kube-apiserver:v1.36.3",
    "registry.k8s.io/kube-controller-manager:v1.36.3",
    "registry.k8s.io/kube-scheduler:v1.36.3",
    "registry.k8s.io/kube-proxy:v1.36.3",
    "registry.k8s.io/coredns/coredns:v1.14.2",
    "registry.k8s.io/pause:3.10.2",
    "registry.k8s.io/etcd:3.6.8-0",
)


def test_the_preloaded_images_are_the_ones_kubeadm_asks_for() -> None:
    assert preload.kubeadm_images() == KUBEADM_V1_36_3


def test_the_image_reference_names_the_kubernetes_version_and_the_inputs() -> None:
    assert nodeimage.image_reference("0123456789ab") == "pykcm-local/kind-node:v1.36.3-0123456789ab"


def test_the_digest_changes_with_any_input_and_not_with_their_order() -> None:
    parts = {"kubelet": b"stamp 1", "containerd.toml": b"config", "kind:usr/local/bin/entrypoint": b"#!/bin/bash"}
    digest = nodeimage.input_digest(parts)
    assert len(digest) == 12 and int(digest, 16) >= 0
    assert nodeimage.input_digest(dict(reversed(parts.items()))) == digest
    for name in parts:
        assert nodeimage.input_digest({**parts, name: parts[name] + b"!"}) != digest
    # A value cannot move into its neighbour's name and give the same digest.
    assert nodeimage.input_digest({"ab": b"c"}) != nodeimage.input_digest({"a": b"bc"})


def _fake_inputs(tmp_path: Path) -> nodeimage.Inputs:
    binaries = {}
    for name in nodeimage.COMPONENTS:
        binary = tmp_path / "bin" / name
        binary.parent.mkdir(exist_ok=True)
        binary.write_bytes(b"\x7fELF")
        binary.with_name(name + ".stamp").write_text(json.dumps({"wrapper": "w", "modules": {"k8s.io/x": "v1"}}))
        binaries[name] = binary
    kind_files = tmp_path / "kind"
    for relative in nodefiles.KIND_FILES:
        (kind_files / relative).parent.mkdir(parents=True, exist_ok=True)
        (kind_files / relative).write_text(f"# {relative}\n")
    tool = tmp_path / "tool"
    tool.write_bytes(b"\x7fELF tool")
    return nodeimage.Inputs(base="pykcm-local/kind-base:abc", rootfs_tar=tmp_path / "rootfs.tar",
                            binaries=binaries, runc=tool, coredns=tool, pause=tool, kind_files=kind_files)


def test_a_rebuilt_binary_or_a_changed_kind_file_makes_a_new_image(tmp_path: Path) -> None:
    inputs = _fake_inputs(tmp_path)
    digest = nodeimage.input_digest(nodeimage.input_parts(inputs))
    assert nodeimage.input_digest(nodeimage.input_parts(inputs)) == digest  # nothing changed: reused
    stamp = inputs.binaries["kubeadm"].with_name("kubeadm.stamp")
    stamp.write_text(stamp.read_text().replace("v1", "v2"))
    rebuilt = nodeimage.input_digest(nodeimage.input_parts(inputs))
    assert rebuilt != digest
    (inputs.kind_files / "usr/local/bin/entrypoint").write_text("# a newer kind\n")
    assert nodeimage.input_digest(nodeimage.input_parts(inputs)) not in (digest, rebuilt)


def test_a_binary_without_its_build_stamp_is_refused(tmp_path: Path) -> None:
    inputs = _fake_inputs(tmp_path)
    inputs.binaries["etcd"].with_name("etcd.stamp").unlink()
    with pytest.raises(BuildError, match="etcd has no build stamp"):
        nodeimage.input_parts(inputs)


def test_containerd_config_runs_runc_v1_5_with_the_sandbox_kubeadm_expects() -> None:
    text = nodefiles.containerd_config()
    cri = tomllib.loads(text)["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "registry.k8s.io/pause:3.10.2" == preload.PAUSE_IMAGE
    assert cri["restrict_oom_score_adj"] is True  # no CAP_SYS_RESOURCE in unprivileged nodes
    runc = cri["containerd"]["runtimes"]["runc"]
    assert runc["options"] == {"BinaryName": "/usr/local/sbin/runc", "SystemdCgroup": True}
    assert runc["base_runtime_spec"] == "/etc/containerd/cri-base.json"
    assert cri["containerd"]["runtimes"]["test-handler"] == runc
    assert cri["cni"] == {"bin_dir": "/opt/cni/bin", "conf_dir": "/etc/cni/net.d"}
    # kind's entrypoint switches snapshotters with sed on exactly this line.
    assert '\n  snapshotter = "overlayfs"\n' in text


def test_node_files_are_laid_out_where_kind_and_its_units_look(tmp_path: Path) -> None:
    inputs = _fake_inputs(tmp_path)
    binaries = nodefiles.NodeBinaries(inputs.binaries["kubeadm"], inputs.binaries["kubelet"],
                                      inputs.binaries["kubectl"], inputs.runc)
    staging = tmp_path / "node"
    staging.mkdir(mode=0o700)
    nodefiles.write_node_files(staging, binaries, inputs.kind_files)
    assert stat.S_IMODE(staging.stat().st_mode) == 0o755  # it becomes the image's /
    assert (staging / "kind/version").read_text() == "v1.36.3"
    for executable in ("usr/bin/kubeadm", "usr/bin/kubelet", "usr/bin/kubectl", "usr/local/sbin/runc",
                       "usr/local/bin/entrypoint", "kind/bin/mount-product-files.sh"):
        assert stat.S_IMODE((staging / executable).stat().st_mode) == 0o755, executable
    assert stat.S_IMODE((staging / "etc/systemd/system/kubelet.service").stat().st_mode) == 0o644
    wants = staging / "etc/systemd/system/multi-user.target.wants"
    assert sorted(os.listdir(wants)) == ["containerd.service", "kubelet.service", "undo-mount-hacks.service"]
    assert os.readlink(staging / "etc/systemd/system/systemd-binfmt.service") == "/dev/null"
    assert os.readlink(staging / "usr/local/bin/containerd") == "/usr/bin/containerd"
    assert os.readlink(staging / "opt/cni/bin/ptp") == "/usr/lib/cni/ptp"
    assert (staging / "etc/kubernetes/manifests").is_dir()
    assert not (staging / "etc/systemd/system/containerd-fuse-overlayfs.service").exists()


def test_a_kind_file_missing_from_the_module_is_named(tmp_path: Path) -> None:
    inputs = _fake_inputs(tmp_path)
    (inputs.kind_files / "usr/local/bin/entrypoint").unlink()
    binaries = nodefiles.NodeBinaries(inputs.runc, inputs.runc, inputs.runc, inputs.runc)
    (tmp_path / "node").mkdir()
    with pytest.raises(BuildError, match=re.escape("entrypoint is missing from sigs.k8s.io/kind@v0.33.0")):
        nodefiles.write_node_files(tmp_path / "node", binaries, inputs.kind_files)


DPKG_STATUS = """Package: iptables
Status: install ok installed
Depends: libip4tc2 (= 1.8.9-2), libxtables12 (>= 1.8.9), netbase | netbase-ng,
 libc6 (>= 2.34)
Pre-Depends: init-system-helpers:any

Package: libip4tc2
Status: install ok installed
Depends: libc6 (>= 2.4)

Package: libxtables12
Status: install ok installed
Depends: libc6

Package: netbase
Status: install ok installed

Package: libc6
Status: install ok installed
Depends: libgcc-s1

Package: libgcc-s1
Status: install ok installed

Package: init-system-helpers
Status: install ok installed

Package: systemd
Status: install ok installed
Depends: libc6

Package: removed-one
Status: deinstall ok config-files
"""


def test_the_dpkg_closure_of_iptables_takes_installed_alternatives_and_nothing_else() -> None:
    installed = preload.parse_dpkg_status(DPKG_STATUS)
    assert "removed-one" not in installed
    assert installed["iptables"][2] == ["netbase", "netbase-ng"]
    assert preload.dependency_closure(installed, "iptables") == {
        "iptables", "libip4tc2", "libxtables12", "netbase", "libc6", "libgcc-s1", "init-system-helpers",
    }


ROOTFS_STATUS = """Package: iptables
Status: install ok installed
Depends: libc6 (>= 2.34)

Package: libc6
Status: install ok installed
"""


def _rootfs_tar(path: Path) -> Path:
    """A merged-/usr root like debootstrap's, with dpkg's database for two packages."""
    entries: list[tuple[str, bytes | str | None]] = [  # bytes: file, str: symlink target, None: directory
        ("./lib", "usr/lib"), ("./sbin", "usr/sbin"), ("./lib64", "usr/lib64"),
        ("./usr/sbin/xtables-nft-multi", b"ELF multi"), ("./usr/sbin/iptables-nft", "xtables-nft-multi"),
        ("./usr/lib/x86_64-linux-gnu/libc.so.6", b"ELF libc"),
        ("./usr/lib64/ld-linux-x86-64.so.2", "../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
        ("./usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", b"ELF ld"),
        ("./usr/share/doc/iptables/copyright", b"text"), ("./usr/sbin", None),
        ("./var/lib/dpkg/status", ROOTFS_STATUS.encode()),
        ("./var/lib/dpkg/info/iptables.list", b"/.\n/sbin\n/sbin/xtables-nft-multi\n/usr/sbin/iptables-nft\n"
                                              b"/usr/share/doc/iptables/copyright\n"),
        ("./var/lib/dpkg/info/libc6:amd64.list", b"/lib/x86_64-linux-gnu/libc.so.6\n/lib64/ld-linux-x86-64.so.2\n"
                                                 b"/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2\n"),
    ]
    with tarfile.open(path, "w") as tar:
        for name, content in entries:
            info = tarfile.TarInfo(name)
            if content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif isinstance(content, str):
                info.type, info.linkname = tarfile.SYMTYPE, content
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return path


def test_iptables_files_come_from_the_root_with_merged_usr_paths_resolved(tmp_path: Path) -> None:
    files, links = preload.debian_files(_rootfs_tar(tmp_path / "rootfs.tar"), "iptables")
    assert files == {
        "usr/sbin/xtables-nft-multi": b"ELF multi",
        "usr/lib/x86_64-linux-gnu/libc.so.6": b"ELF libc",
        "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2": b"ELF ld",
    }
    assert links == {
        "usr/sbin/iptables-nft": "xtables-nft-multi",
        "usr/lib64/ld-linux-x86-64.so.2": "../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        "lib": "usr/lib", "sbin": "usr/sbin", "lib64": "usr/lib64",  # the ELF interpreter's path
    }


def _layer_of(archive: Path) -> tuple[dict, tarfile.TarFile]:
    with tarfile.open(archive) as outer:
        (entry,) = json.load(outer.extractfile("manifest.json"))  # type: ignore[arg-type]
        config = json.load(outer.extractfile(entry["Config"]))  # type: ignore[arg-type]
        layer = outer.extractfile(entry["Layers"][0]).read()  # type: ignore[union-attr]
    return {"tags": entry["RepoTags"], **config["config"]}, tarfile.open(fileobj=io.BytesIO(layer))


def test_control_plane_images_keep_binaries_in_usr_local_bin_on_path(tmp_path: Path) -> None:
    binary = tmp_path / "kube-apiserver"
    binary.write_bytes(b"\x7fELF apiserver")
    archive = preload.write_archive(preload.binary_image(KUBEADM_V1_36_3[0], binary), tmp_path)
    config, layer = _layer_of(archive)
    assert config["tags"] == [KUBEADM_V1_36_3[0]]
    assert "/usr/local/bin" in config["Env"][0].removeprefix("PATH=").split(":")
    assert layer.extractfile("usr/local/bin/kube-apiserver").read() == b"\x7fELF apiserver"  # type: ignore[union-attr]
    for directory in ("usr", "usr/local", "usr/local/bin", "tmp", "etc"):
        assert layer.getmember(directory).isdir(), directory


def test_kube_proxy_image_runs_iptables_through_the_wrapper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    busybox = tmp_path / "busybox"
    busybox.write_bytes(b"\x7fELF busybox")
    monkeypatch.setattr(preload, "BUSYBOX", busybox)
    proxy = tmp_path / "kube-proxy"
    proxy.write_bytes(b"\x7fELF proxy")
    image = preload.kube_proxy_image(KUBEADM_V1_36_3[3], proxy, _rootfs_tar(tmp_path / "rootfs.tar"))
    _, layer = _layer_of(preload.write_archive(image, tmp_path))
    names = set(layer.getnames())
    assert {"usr/local/bin/kube-proxy", "usr/sbin/xtables-nft-multi", "usr/bin/busybox"} <= names
    for command in ("iptables", "iptables-restore", "ip6tables-save"):
        assert layer.getmember(f"usr/sbin/{command}").linkname == "iptables-wrapper"
    assert layer.getmember("usr/bin/sh").linkname == "busybox"


def _wrapper_run(tmp_path: Path, legacy_save: str, nft_save: str) -> str:
    """Run the wrapper as `iptables-restore` with fake backends that print their saved rules."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    for mode, saved in (("legacy", legacy_save), ("nft", nft_save)):
        fake = bin_dir / f"xtables-{mode}-multi"
        fake.write_text(f"#!/bin/sh\ncase \"$1\" in *-save) printf '%b' '{saved}' ;; *) echo \"{mode} $*\" ;; esac\n")
        fake.chmod(0o755)
    wrapper = bin_dir / "iptables-restore"
    wrapper.write_text(preload.IPTABLES_WRAPPER.replace("/tmp/.iptables-mode", str(tmp_path / "mode")))
    wrapper.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    return subprocess.run([str(wrapper), "--noflush"], env=env, capture_output=True, text=True, check=True).stdout


def test_the_wrapper_follows_kubelets_marker_chains(tmp_path: Path) -> None:
    out = _wrapper_run(tmp_path, legacy_save=":KUBE-IPTABLES-HINT - [0:0]\\n", nft_save="-A X\\n-A Y\\n-A Z\\n")
    assert out.strip() == "legacy iptables-restore --noflush"
    assert (tmp_path / "mode").read_text().strip() == "legacy"  # decided once


def test_without_markers_the_wrapper_takes_the_backend_with_more_rules_else_nft(tmp_path: Path) -> None:
    assert _wrapper_run(tmp_path / "a", "-A X\\n", "-A X\\n-A Y\\n").startswith("nft ")
    assert _wrapper_run(tmp_path / "b", "-A X\\n-A Y\\n", "-A X\\n").startswith("legacy ")
    assert _wrapper_run(tmp_path / "c", "", "").startswith("nft ")


def test_missing_prerequisites_are_one_line_each_with_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(nodeimage.docker.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(nodeimage.baseimage.shutil, "which", lambda name: None)
    monkeypatch.setattr(nodeimage, "BUSYBOX", Path("/bin/sh"))  # present, but not static on Debian
    monkeypatch.setattr(nodeimage, "find_go", lambda: "/usr/bin/go")
    monkeypatch.setattr(nodeimage, "cached_runc", lambda: True)
    monkeypatch.setattr(nodeimage.preload, "cached_pause", lambda: True)
    missing = nodeimage.missing_prerequisites()
    assert "the private Docker engine needs root (dockerd runs as root)" in missing
    assert "debootstrap is not on PATH: apt-get install debootstrap" in missing
    assert missing[-1] == "/bin/sh is not a static busybox (kube-proxy's image runs it): apt-get install busybox-static"
    assert all("\n" not in line for line in missing)


def _only_builds_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Root, docker.io, debootstrap and busybox there; none of the C builds' packages, no Go."""
    monkeypatch.setattr(nodeimage.docker, "missing_prerequisites", lambda: [])
    monkeypatch.setattr(nodeimage.baseimage, "missing_prerequisites", lambda: [])
    monkeypatch.setattr(nodeimage, "BUSYBOX", tmp_path / "busybox")
    (tmp_path / "busybox").write_text("")
    monkeypatch.setattr(nodeimage, "is_static", lambda path: True)
    absent = tmp_path / "absent"
    monkeypatch.setattr(nodeimage, "RUNC_BUILD_PACKAGES", tuple((p, str(absent / p)) for p, _ in RUNC_BUILD_PACKAGES))
    monkeypatch.setattr(nodeimage.preload, "PAUSE_BUILD_PACKAGES",
                        tuple((p, str(absent / p)) for p, _ in preload.PAUSE_BUILD_PACKAGES))

    def no_go() -> str:
        raise BuildError("the Go toolchain (go >= 1.26) is not on PATH: install it")

    monkeypatch.setattr(nodeimage, "find_go", no_go)


def test_the_c_builds_packages_and_go_are_prerequisites_until_their_results_are_cached(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _only_builds_missing(monkeypatch, tmp_path)
    monkeypatch.setattr(nodeimage, "cached_runc", lambda: False)
    monkeypatch.setattr(nodeimage.preload, "cached_pause", lambda: False)
    packages = "gcc libseccomp-dev pkg-config libc6-dev"
    assert nodeimage.missing_prerequisites() == [
        f"building runc and pause needs the Debian packages {packages}: apt-get install {packages}",
        "the Go toolchain (go >= 1.26) is not on PATH: install it",
    ]
    monkeypatch.setattr(nodeimage, "cached_runc", lambda: True)
    assert nodeimage.missing_prerequisites()[0].startswith("building runc and pause needs the Debian packages gcc "
                                                           "libc6-dev:")
    monkeypatch.setattr(nodeimage.preload, "cached_pause", lambda: True)
    assert nodeimage.missing_prerequisites() == ["the Go toolchain (go >= 1.26) is not on PATH: install it"]


def test_a_compiled_pause_in_the_cache_counts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert not preload.cached_pause()
    pause = tmp_path / "pykcm" / "images" / f"pause-{preload.PAUSE_VERSION}-0123456789ab" / "pause"
    pause.parent.mkdir(parents=True)
    pause.write_text("")
    pause.chmod(0o755)
    assert preload.cached_pause()


def test_the_cli_names_a_missing_c_build_package_before_the_engine_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pykcm.app import cli

    _only_builds_missing(monkeypatch, tmp_path)
    monkeypatch.setattr(nodeimage, "cached_runc", lambda: False)
    monkeypatch.setattr(nodeimage.preload, "cached_pause", lambda: True)
    monkeypatch.setattr(nodeimage.docker, "running", lambda *a, **k: pytest.fail("the engine was started"))
    assert cli.main(["testenv", "kind-image"]) == 1
    assert capsys.readouterr().err == (
        "pykcm: error: building runc and pause needs the Debian packages gcc libseccomp-dev pkg-config: apt-get "
        "install gcc libseccomp-dev pkg-config; the Go toolchain (go >= 1.26) is not on PATH: install it\n"
    )


def test_the_help_says_what_the_commands_need_and_what_the_group_holds(capsys: pytest.CaptureFixture[str]) -> None:
    from pykcm.app import cli

    def help_text(*command: str) -> str:
        assert cli.main([*command, "--help"]) == 0
        return " ".join(capsys.readouterr().out.split())

    group = help_text("testenv")
    assert "control plane" in group and "pykcm's container image and a kind node image" in group
    kind = help_text("testenv", "kind-image")
    for needed in ("root", "Go,", "docker.io", "debootstrap", "busybox-static", "gcc", "libc6-dev", "libseccomp-dev",
                   "pkg-config", "the Go module proxy and a Debian mirror"):
        assert needed in kind, needed
    assert "offline" not in kind
    assert "PyPI" in help_text("testenv", "image")


def test_is_static_tells_a_static_busybox_from_a_dynamic_shell() -> None:
    assert not images.is_static(Path("/bin/sh"))


def test_control_plane_images_bring_the_c_library_their_binaries_link(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preload, "BUSYBOX", tmp_path / "busybox")
    for name in ("busybox", *nodeimage.COMPONENTS, "coredns", "pause"):
        (tmp_path / name).write_bytes(b"\x7fELF " + name.encode())
    binaries = {name: tmp_path / name for name in nodeimage.COMPONENTS}
    made = preload.all_images(binaries, tmp_path / "coredns", tmp_path / "pause", _rootfs_tar(tmp_path / "root.tar"))
    assert tuple(image.reference for image in made) == KUBEADM_V1_36_3
    by_name = {image.reference.rsplit("/", 1)[-1].split(":")[0]: image for image in made}
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "etcd"):
        assert "usr/lib/x86_64-linux-gnu/libc.so.6" in by_name[name].files, name
        assert by_name[name].links["lib64"] == "usr/lib64", name
    assert set(by_name["coredns"].files) == {"coredns"} and by_name["coredns"].entrypoint == ("/coredns",)
    assert set(by_name["pause"].files) == {"pause"} and by_name["pause"].entrypoint == ("/pause",)


def test_the_cli_refuses_without_root_in_one_line_before_starting_anything(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pykcm.app import cli

    monkeypatch.setattr(nodeimage.docker.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(nodeimage.docker, "running", lambda *a, **k: pytest.fail("the engine was started"))
    assert cli.main(["testenv", "kind-image"]) == 1
    err = capsys.readouterr().err
    # One line; prerequisites this machine lacks (dockerd, debootstrap, ...) are named after it.
    assert err.startswith("pykcm: error: the private Docker engine needs root (dockerd runs as root)")
    assert err.endswith("\n") and err.count("\n") == 1


def test_kind_files_without_the_module_proxy_name_the_cause_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    error = 'Get "https://proxy.example/sigs.k8s.io/kind/@v/v0.33.0.info": dial tcp: i/o timeout'
    offline = json.dumps({"Path": "sigs.k8s.io/kind", "Version": "v0.33.0", "Error": error})
    monkeypatch.setattr(nodefiles, "find_go", lambda: "go")
    monkeypatch.setattr(nodefiles.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 1, stdout=offline + "\n", stderr=""))
    with pytest.raises(BuildError) as err:
        nodefiles.kind_files_dir()
    assert str(err.value) == (
        'go mod download sigs.k8s.io/kind@v0.33.0 failed: Get "https://proxy.example/sigs.k8s.io/kind/@v/'
        'v0.33.0.info": dial tcp: i/o timeout (give this machine access to the Go module proxy, or set GOPROXY '
        "to a mirror)"
    )
