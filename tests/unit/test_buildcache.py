"""The build cache keeps each binary while its wrapper and the modules it links are unchanged:
adding a wrapper (kubelet) and the requirements only it needs must not rebuild the control plane."""

from __future__ import annotations

from pathlib import Path

from pykcm.testenv import buildcache
from pykcm.testenv.buildcache import adopt_legacy, is_current, selected_modules, wrapper_hash, write_stamp

GO_MOD = """module example/controlplane

go 1.26.0

require (
\tk8s.io/kubernetes v1.36.3
\tgithub.com/a/b v1.0.0 // indirect
)

require k8s.io/api v0.0.0

replace (
\tk8s.io/api => k8s.io/api v0.36.3
)
"""


def fake_go_binary(path: Path, deps: dict[str, str]) -> Path:
    """A file carrying Go build information the way the linker lays it out."""
    lines = ["path\texample/controlplane/tool", "mod\texample/controlplane\t(devel)\t"]
    for module, version in deps.items():
        required, _, replacement = version.partition(" => ")
        lines.append(f"dep\t{module}\t{required}\th1:x=")
        if replacement:
            lines.append("=>\t" + "\t".join(replacement.split()) + "\th1:y=")
    modinfo = buildcache._MODINFO_START + "\n".join(lines).encode() + buildcache._MODINFO_END
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x7fELF" + b"\0" * 60 + buildcache._BUILDINFO_MAGIC + b"\x08\x02" + b"\0" * 16 + modinfo)
    path.chmod(0o755)
    return path


def wrapper_dir(gomod: Path, name: str, text: str = "package main\n") -> str:
    (gomod / name).mkdir(parents=True, exist_ok=True)
    (gomod / name / "main.go").write_text(text)
    return wrapper_hash(gomod, name)


def test_go_mod_selection_applies_replacements() -> None:
    assert selected_modules(GO_MOD) == {
        "k8s.io/kubernetes": "v1.36.3",
        "github.com/a/b": "v1.0.0",
        "k8s.io/api": "v0.0.0 => k8s.io/api v0.36.3",
    }


def test_binary_stays_current_when_go_mod_only_grows(tmp_path: Path) -> None:
    wrapper = wrapper_dir(tmp_path / "gomod", "tool")
    binary = fake_go_binary(tmp_path / "cache" / "tool", {"k8s.io/api": "v0.0.0 => k8s.io/api v0.36.3"})
    write_stamp(binary, wrapper)
    assert is_current(binary, wrapper, selected_modules(GO_MOD))
    # A new wrapper needs a new module: the existing binary does not link it and stays current.
    grown = GO_MOD + "\nrequire github.com/moby/ipvs v1.1.0 // indirect\n"
    wrapper_dir(tmp_path / "gomod", "kubelet")
    assert is_current(binary, wrapper_hash(tmp_path / "gomod", "tool"), selected_modules(grown))


def test_binary_is_stale_when_its_module_or_wrapper_changes(tmp_path: Path) -> None:
    wrapper = wrapper_dir(tmp_path / "gomod", "tool")
    binary = fake_go_binary(tmp_path / "cache" / "tool", {"github.com/a/b": "v1.0.0"})
    write_stamp(binary, wrapper)
    assert not is_current(binary, wrapper, selected_modules(GO_MOD.replace("b v1.0.0", "b v1.1.0")))
    changed = wrapper_dir(tmp_path / "gomod", "tool", "package main // changed\n")
    assert not is_current(binary, changed, selected_modules(GO_MOD))
    assert not is_current(tmp_path / "cache" / "absent", wrapper, selected_modules(GO_MOD))


def test_binary_a_crash_left_empty_is_stale_though_stamped(tmp_path: Path) -> None:
    """Its stamp written, then a machine crash: the rename reached the disk, the data did not."""
    wrapper = wrapper_dir(tmp_path / "gomod", "tool")
    binary = fake_go_binary(tmp_path / "cache" / "tool", {"github.com/a/b": "v1.0.0"})
    write_stamp(binary, wrapper)
    binary.write_bytes(b"")
    assert not is_current(binary, wrapper, selected_modules(GO_MOD))


def test_binaries_of_the_hash_named_cache_are_adopted_without_copying(tmp_path: Path) -> None:
    wrapper = wrapper_dir(tmp_path / "gomod", "tool")
    legacy = fake_go_binary(tmp_path / "cache" / "v1.36.3-567d0fe118f4" / "tool", {"github.com/a/b": "v1.0.0"})
    target = tmp_path / "cache" / "v1.36.3"
    selection = selected_modules(GO_MOD)
    assert adopt_legacy(target, "tool", wrapper, selection)
    assert is_current(target / "tool", wrapper, selection)
    assert (target / "tool").stat().st_ino == legacy.stat().st_ino
    # One linked from other module versions is left where it is.
    fake_go_binary(tmp_path / "cache" / "v1.36.3-0123456789ab" / "other", {"github.com/a/b": "v0.9.0"})
    assert not adopt_legacy(target, "other", wrapper, selection)
