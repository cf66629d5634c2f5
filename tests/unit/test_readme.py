"""The README's reference tables are generated from the code and must match it."""

from pykcm.app import docs


def test_readme_tables_match_the_cli_and_metrics():
    text = docs.README.read_text()
    assert docs.render(text) == text, "README.md is out of date: run `python -m pykcm.app.docs --write`"


def test_readme_has_exactly_the_two_setup_commands():
    text = docs.README.read_text()
    assert "pip install '.[local]' && pykcm run --local" in text
    assert "pip install '.[test]' && python -m pytest" in text
