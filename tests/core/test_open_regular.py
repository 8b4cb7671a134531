"""Opening an untrusted path reads nothing before it is known to be a regular file."""

from __future__ import annotations

import os

import pytest

from traceflops.core.files import open_if_regular


def test_a_regular_file_opens_at_its_start(tmp_path):
    p = tmp_path / "t.json"
    p.write_bytes(b"{}")
    f, st = open_if_regular(p)
    with f:
        assert f.read() == b"{}" and st.st_size == 2


def test_a_fifo_without_a_writer_neither_hangs_nor_opens(tmp_path):
    p = tmp_path / "pipe"
    os.mkfifo(p)
    f, st = open_if_regular(p)  # a blocking open would wait for a writer forever
    assert f is None and not os.path.isfile(p)


def test_a_device_is_not_opened_for_reading():
    f, _ = open_if_regular("/dev/zero")
    assert f is None


def test_a_link_is_followed_only_when_asked(tmp_path):
    target = tmp_path / "t.json"
    target.write_bytes(b"{}")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    f, _ = open_if_regular(link)
    f.close()
    with pytest.raises(OSError):
        open_if_regular(link, follow_links=False)
