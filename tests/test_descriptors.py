"""A file refused at open gives its descriptor back once: a second close of the same number,
after the number has been reused by another open file, would close that file under its
reader (an ``OSError: Bad file descriptor`` far from the cause, depending on test order)."""

from __future__ import annotations

import gc
import os

import pytest

from comfyquant.errors import InputError
from comfyquant.io.source import LocalFile


def test_a_refused_special_file_does_not_close_a_later_files_descriptor(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    data = tmp_path / "data.bin"
    data.write_bytes(b"0123456789")
    for _ in range(20):
        with pytest.raises(InputError, match="pipe"):
            LocalFile(str(fifo))
        reader = LocalFile(str(data))  # takes the number the refused open gave back
        gc.collect()  # the refused object's __del__ runs now
        assert reader.pread(2, 3) == b"234"
        reader.close()
