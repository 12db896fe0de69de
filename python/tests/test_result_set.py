"""Readers refuse a result set without a manifest or not matching it (attnscope_dump.result_set),
and a set published from Python verifies like one published by attnscope."""
import json
import os

import pytest

from attnscope_dump import figures
from attnscope_dump.result_set import ResultSetError, publish, verified_path, verify


def _publish(folder, rows):
    with publish(str(folder), "x.json") as st:
        with open(st.path("a.csv"), "w") as f:
            f.write("k,v\n" + "".join(f"{i},{v}\n" for i, v in enumerate(rows)))
        st.publish({"command": "test"})


def test_published_set_verifies_and_reads(tmp_path):
    _publish(tmp_path, [1, 2])
    m = verify(str(tmp_path / "x.json"))
    assert [e["name"] for e in m["files"]] == ["a.csv"]
    assert list(figures.read_csv(str(tmp_path / "a.csv"))["v"]) == [1.0, 2.0]
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".attnscope-tmp-")]


def test_reader_refuses_file_without_manifest(tmp_path):
    _publish(tmp_path, [1, 2])
    os.unlink(tmp_path / "x.json")
    with pytest.raises(ResultSetError, match="no manifest"):
        figures.read_csv(str(tmp_path / "a.csv"))


def test_reader_refuses_changed_file(tmp_path):
    _publish(tmp_path, [1, 2])
    (tmp_path / "a.csv").write_text("k,v\n0,1\n1,3\n")  # same size, other content
    with pytest.raises(ResultSetError, match="SHA-256"):
        verified_path(str(tmp_path / "a.csv"))


def test_reader_refuses_record_without_files(tmp_path):
    (tmp_path / "a.csv").write_text("k,v\n0,1\n")
    (tmp_path / "x.json").write_text(json.dumps({"command": "old"}))
    with pytest.raises(ResultSetError):
        figures.read_csv(str(tmp_path / "a.csv"))


def test_new_set_removes_files_the_old_one_had(tmp_path):
    with publish(str(tmp_path), "x.json") as st:
        for n in ("a.csv", "b.csv"):
            open(st.path(n), "w").write("k\n1\n")
        st.publish({})
    _publish(tmp_path, [5])
    assert not (tmp_path / "b.csv").exists()
    verify(str(tmp_path / "x.json"))
