"""Where the local base image's Debian packages come from: the mirror apt on this machine uses."""

from pathlib import Path

from pykcm.testenv.baseimage import DEFAULT_MIRROR, debian_mirror

DEB822 = """Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main

Types: deb
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
"""


def test_the_main_suite_of_a_deb822_source_wins_over_security(tmp_path: Path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(DEB822)
    assert debian_mirror(tmp_path) == "http://mirror.example/debian"


def test_one_line_sources_with_options_are_read(tmp_path: Path):
    (tmp_path / "sources.list").write_text(
        "# comment\ndeb [signed-by=/k.gpg] http://other.example/debian bookworm main\n"
    )
    assert debian_mirror(tmp_path) == "http://other.example/debian"


def test_without_sources_debian_itself(tmp_path: Path):
    assert debian_mirror(tmp_path) == DEFAULT_MIRROR
