"""The pd-english corpus readers on tiny synthetic packages (no network, milliseconds): a .deb
read without dpkg, a SWORD module's zlib blocks, dictd entries, an R character vector."""

import io
import struct
import tarfile
import zlib

import pytest

from data_prep.errors import DataPrepError
from data_prep.pd_corpus import (CORPORA, DEBS, PD_SOURCES, deb_files, deb_path, dictd_documents,
                                 SOURCES, osis_to_text, r_character_vector, r_lazyload_objects, sword_blocks)


def _ar_member(name: bytes, data: bytes) -> bytes:
    header = name.ljust(16) + b"0".ljust(12) + b"0".ljust(6) + b"0".ljust(6) + b"100644".ljust(8)
    header += str(len(data)).encode().ljust(10) + b"`\n"
    return header + data + (b"\n" if len(data) % 2 else b"")


def _deb(files: dict[str, bytes]) -> bytes:
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w:xz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return (b"!<arch>\n" + _ar_member(b"debian-binary", b"2.0\n") + _ar_member(b"control.tar.xz", b"")
            + _ar_member(b"data.tar.xz", payload.getvalue()))


def test_deb_files_reads_the_data_member(tmp_path):
    path = tmp_path / "x.deb"
    path.write_bytes(_deb({"usr/share/dictd/a.index": b"i", "usr/share/dictd/a.dict.dz": b"d", "usr/bin/x": b"no"}))
    assert deb_files(path, "usr/share/dictd/") == {"a.index": b"i", "a.dict.dz": b"d"}
    (tmp_path / "bad.deb").write_bytes(b"not an archive")
    with pytest.raises(DataPrepError, match="not a Debian package"):
        deb_files(tmp_path / "bad.deb", "")


def test_sword_blocks_and_osis_text():
    blocks = [b'<title type="main">Genesis</title> In the <w lemma="strong:H7225">beginning</w> God'
              b'<note type="x-study">a note</note> created.<lb/>And &amp; more.', b"<div/>Exodus"]
    blob, index = b"", b""
    for block in blocks:
        packed = zlib.compress(block)
        index += struct.pack("<III", len(blob), len(packed), len(block))
        blob += packed
    got = list(sword_blocks({"ot.bzs": index, "ot.bzz": blob}, "b"))
    assert got == blocks
    assert osis_to_text(got[0]) == "Genesis\nIn the beginning God created.\nAnd & more.\n"


def test_dictd_documents_skip_metadata_and_group_entries():
    text = b"00-database-info\nabout\nalpha\n first\nbeta\n second\ngamma\n third\n"
    b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

    def entry(word, start, stop):
        return f"{word}\t{b64[start]}\t{b64[stop - start]}"

    spans = {"00-database-info": (0, 23), "alpha": (23, 36), "beta": (36, 49), "gamma": (49, 61)}
    index = "\n".join(entry(w, *s) for w, s in spans.items()).encode()
    docs = dictd_documents(text, index, "Tiny", target_bytes=20)
    assert [d[2] for d in docs] == [b"alpha\n first\n\nbeta\n second\n", b"gamma\n third\n"]


def test_r_lazyload_character_vector():
    strings = ["EMMA", None, "By Jane Austen"]
    body = b"X\n" + struct.pack(">iii", 3, 0x40000, 0x30500) + struct.pack(">i", 5) + b"UTF-8"
    body += struct.pack(">ii", 16, len(strings))
    for s in strings:
        body += struct.pack(">ii", 9, -1) if s is None else struct.pack(">ii", 0x40009, len(s)) + s.encode()
    rdb = (struct.pack(">I", len(body)) + zlib.compress(body)) * 2
    assert [r_character_vector(o) for o in r_lazyload_objects(rdb)] == [strings, strings]


def test_corpora_are_pinned_and_the_default_is_public_domain():
    assert set(CORPORA["pd-english"]) == set(PD_SOURCES) and "gcide" not in CORPORA["pd-english"]
    assert all(len(d.sha256) == 64 and d.license for d in DEBS.values())
    assert not any("GPL" in DEBS[n].license for n in DEBS if n != "dict-gcide")


def test_fetch_path_on_the_smallest_package(tmp_path):
    """The real path on one 180 kB package: apt-get download, sha256 check (a wrong cached file is
    replaced), extraction. Skipped where the Debian archive is unreachable."""
    deb = DEBS["dict-devil"]
    (tmp_path / deb.filename).write_bytes(b"a damaged download")
    try:
        path = deb_path(deb, tmp_path)
    except DataPrepError as e:
        assert deb.sha256 in str(e)  # says which file to copy where
        pytest.skip(f"no Debian archive here: {str(e)[:120]}")
    assert path.stat().st_size > 100_000
    docs = SOURCES["devil"].extract(path)
    assert len(docs) == 3 and b"ABASEMENT" in docs[0][2].upper()
