"""docs/operators.md is generated from the fission registries (docs/make_operators.py): it, and the
README's counts of operators, must say what the registries hold."""

from helpers import load_script


def _make_operators():
    return load_script("docs/make_operators.py")


def test_operators_doc_is_current():
    make = _make_operators()
    stale = "docs/operators.md is stale: run python docs/make_operators.py"
    assert make.DOC.read_text() == make.render(), stale


def test_readme_counts_the_registered_operators():
    make = _make_operators()
    problem = make.readme_problem(make.README.read_text())
    assert problem is None, problem


def test_every_registered_op_type_is_listed_once():
    make = _make_operators()
    text = make.DOC.read_text()
    n_onnx, n_ort, n_aten = make.counts()
    assert n_onnx > 100 and n_ort > 10 and n_aten > 200
    for domain in ("", make.ONNX_RUNTIME):
        for op, opsets, _ in make.onnx_rows(domain):
            assert f"| `{op}` | {opsets} |" in text
    assert sum(len(overloads.split(", ")) for _, overloads, _ in make.aten_rows()) == n_aten


def test_check_exits_1_when_the_doc_or_the_readme_counts_are_stale(tmp_path, monkeypatch, capsys):
    make = _make_operators()
    monkeypatch.setattr(make, "DOC", tmp_path / "operators.md")
    make.DOC.write_text("# Operators\n")
    monkeypatch.setattr("sys.argv", ["make_operators.py", "--check"])
    assert make.main() == 1 and "stale" in capsys.readouterr().err
    monkeypatch.setattr("sys.argv", ["make_operators.py"])
    assert make.main() == 0 and make.DOC.read_text() == make.render()
    monkeypatch.setattr("sys.argv", ["make_operators.py", "--check"])
    assert make.main() == 0
    n_onnx, n_ort, n_aten = make.counts()
    wrong = (  # (the sentence may wrap)
        f"{n_onnx} ONNX operator types, {n_ort + 1} of ONNX Runtime's (com.microsoft) and\n"
        f"{n_aten} ATen overloads"
    )
    assert "the registries have" in make.readme_problem(wrong)
    assert "no sentence" in make.readme_problem("162 ONNX operators")
