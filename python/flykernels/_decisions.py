# SPDX-License-Identifier: Apache-2.0
"""Ours or stock, per call: the decision rows every override consults (docs/pytorch.md, "Decisions").

A decision row is a row of a FlyKernels tuning database (db/schema.sql, the format flytune
writes) whose op is "torch.<op>" and whose variant is "ours" or "stock": the winner with its time
in time_us, the other in runner_up / runner_up_us, both measured in one process on the card named
in `gpu`. `arch` is the library's arch and the card's model ("sm_90a:H100"). The key columns are
the override's key (python/csrc/decisions.hpp). Rows come from, later ones winning on the same key:
  1. the shipped file beside this module (decisions_sm_90a.sql, measured on H100 and H200),
  2. `python -m flykernels tune`'s output in the cache folder (tuned-<stem>.sqlite),
  3. the autotune cache (FLYKERNELS_AUTOTUNE=1; autotune-<stem>.sqlite),
  4. FLYKERNELS_TUNING_DB (an overlay the library reads too).
<stem> is the library version, torch version and device name, so a new version or card starts
clean. The cache folder is FLYKERNELS_CACHE_DIR, else $XDG_CACHE_HOME/flykernels, else
~/.cache/flykernels."""
import os
import re
import sqlite3
import statistics
import threading
import time
from pathlib import Path

import torch

from . import _loader

PREFIX = "torch."
SHIPPED = Path(__file__).with_name("decisions_sm_90a.sql")
# Version 2's tuning table (the library reads versions 1-3). OR IGNORE: a file flytune made
# version 3 (db/schema.sql: profile rows in their own table) keeps its version.
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('schema_version', '2');
CREATE TABLE IF NOT EXISTS tuning (
  arch TEXT NOT NULL, op TEXT NOT NULL, dtype TEXT NOT NULL, layout TEXT NOT NULL,
  k0 INTEGER NOT NULL, k1 INTEGER NOT NULL, k2 INTEGER NOT NULL, k3 INTEGER NOT NULL DEFAULT 0,
  variant TEXT NOT NULL, time_us REAL, runner_up TEXT, runner_up_us REAL, gpu TEXT, tuned_at TEXT,
  PRIMARY KEY (arch, op, dtype, layout, k0, k1, k2, k3));
"""
_lock = threading.Lock()
sources = []  # [(source, rows read)] of the last load(), for `python -m flykernels` and explain
_warned = set()


def _warn_once(msg):
    if msg not in _warned:
        _warned.add(msg)
        _loader.log.warning("%s", msg)  # the flykernels logger: "flykernels: msg" on stderr by default


def card_model(name):
    """'H100' of 'NVIDIA H100 80GB HBM3', 'H200' of 'NVIDIA H200': the word after the vendor."""
    words = [w for w in re.split(r"\s+", name or "") if w]
    if words and words[0].upper() == "NVIDIA":
        words = words[1:]
    return re.sub(r"[^A-Za-z0-9_.-]", "", words[0]) if words else "unknown"


def device_tag(arch=None, name=None):
    """The rows' arch value for this process's card: 'sm_90a:H100'."""
    if arch is None and _loader.ext is not None and torch.cuda.is_available():
        ok, arch = _loader.ext.device_status(torch.cuda.current_device())
        arch = arch if ok else None
    if name is None and torch.cuda.is_available():
        name = torch.cuda.get_device_name()
    return f"{arch or 'none'}:{card_model(name)}"


def cache_dir():
    d = os.environ.get("FLYKERNELS_CACHE_DIR")
    if not d:
        d = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                         "flykernels")
    return Path(d)


def cache_stem():
    """Library version, torch version and device name, as a file-name part."""
    lib = _loader.ext.library_info()["version"] if _loader.ext is not None else "nolib"
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "nodevice"
    raw = f"{lib}-torch{torch.__version__}-{dev}"
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", raw)


def tuned_path():
    return cache_dir() / f"tuned-{cache_stem()}.sqlite"


def autotune_path():
    return cache_dir() / f"autotune-{cache_stem()}.sqlite"


def _row_from_db(r, source):
    """(arch, op, dtype, layout, k0..k3, ours_us, stock_us, source) of a tuning row, or None."""
    arch, op, dtype, layout, k0, k1, k2, k3, variant, t, ru, ru_t = r
    if variant not in ("ours", "stock") or ru not in ("ours", "stock") or variant == ru:
        return None
    ours, stock = (t, ru_t) if variant == "ours" else (ru_t, t)
    if not ours or not stock or ours <= 0 or stock <= 0:
        return None
    return (arch, op[len(PREFIX):], dtype, layout, int(k0), int(k1), int(k2), int(k3), float(ours), float(stock), source)


_SELECT = ("SELECT arch, op, dtype, layout, k0, k1, k2, k3, variant, time_us, runner_up, runner_up_us "
           "FROM tuning WHERE op LIKE 'torch.%'")


def read_rows(path, source=None):
    """Decision rows of a tuning database file, or of a .sql dump of one; other rows are skipped."""
    path = Path(path)
    source = source or str(path)
    if path.suffix == ".sql":
        con = sqlite3.connect(":memory:")
        try:
            con.executescript(SCHEMA)
            con.executescript(path.read_text())
            raw = con.execute(_SELECT).fetchall()
        finally:
            con.close()
    else:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            raw = con.execute(_SELECT).fetchall()
        finally:
            con.close()
    return [x for x in (_row_from_db(r, source) for r in raw) if x is not None]


def _files():
    """(path, source, must_exist) in precedence order, lowest first."""
    out = [(SHIPPED, "shipped", False)]
    try:
        out += [(tuned_path(), "tuned", False), (autotune_path(), "autotune", False)]
    except Exception as e:  # no device name yet (no CUDA): the cache is keyed by it
        _warn_once(f"decision cache not read ({e})")
    overlay = os.environ.get("FLYKERNELS_TUNING_DB")
    if overlay:
        out.append((Path(overlay), "FLYKERNELS_TUNING_DB", True))
    return out


def load():
    """Reads every source and hands the rows to the extension; returns the row count."""
    ext = _loader.ext
    if ext is None:
        return 0
    merged = {}
    sources.clear()
    for path, source, must in _files():
        if not path.exists():
            if must:
                _warn_once(f"{source}={path} does not exist; its decision rows are not used")
            continue
        try:
            rows = read_rows(path, source)
        except (sqlite3.Error, OSError, UnicodeDecodeError) as e:
            _warn_once(f"decision rows of {path} not read ({type(e).__name__}: {e}); the other sources decide")
            continue
        sources.append((str(path), len(rows)))
        for r in rows:
            merged[r[:8]] = r
    with _lock:
        ext.set_device_tag(device_tag())
        ext.set_decision_rows(list(merged.values()))
    return len(merged)


def _connect_rw(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(str(path), timeout=60)
    con.executescript(SCHEMA)
    return con


def db_row(arch, op, dtype, layout, k, ours_us, stock_us, gpu, when=None):
    """A tuning-table row (the winner first) of one decision."""
    k = list(k) + [0] * (4 - len(k))
    ours_first = ours_us < stock_us
    win, win_t, ru, ru_t = ("ours", ours_us, "stock", stock_us) if ours_first else ("stock", stock_us, "ours", ours_us)
    return (arch, PREFIX + op, dtype, layout, *[int(v) for v in k[:4]], win, round(win_t, 3), ru, round(ru_t, 3), gpu,
            when or time.strftime("%Y-%m-%d"))


def write_rows(path, rows):
    """INSERT OR REPLACE db_row tuples into a tuning database (created with the schema if new). Safe
    under concurrent writers: SQLite's file lock, a long busy timeout, one transaction."""
    con = _connect_rw(Path(path))
    try:
        with con:
            con.executemany("INSERT OR REPLACE INTO tuning VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)
    finally:
        con.close()


def dump_sql(path, rows, header):
    """The reviewable dump: one INSERT per row, sorted, as db/sm_90a.sql."""
    def lit(v):
        if isinstance(v, str):
            return "'" + v.replace("'", "''") + "'"
        if isinstance(v, float):
            return f"{v:.3f}"
        return str(v)
    lines = [f"-- {header}"]
    for r in sorted(rows, key=lambda r: tuple(str(x) for x in r[:8])):
        lines.append(f"INSERT OR REPLACE INTO tuning VALUES ({','.join(lit(v) for v in r)});")
    Path(path).write_text("\n".join(lines) + "\n")


# ---- timing both in one process ----------------------------------------------------------------
_flush_buf = {}


def _flush_l2():
    dev = torch.cuda.current_device()
    if dev not in _flush_buf:  # twice the largest Hopper L2 (60 MiB on the H200)
        _flush_buf[dev] = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    _flush_buf[dev].zero_()


class forced:
    """with forced("ours") / forced("stock"): eligible calls run that side regardless of the rows
    (what the tuner and autotune time); forced(None) restores the rows' say. process=True (the
    default) also forces threads that set no force of their own, the autograd engine's among them,
    so a backward run inside the block is forced too; process=False forces this thread only
    (autotune, which times one op on the calling thread while other threads may run)."""

    _modes = {None: 0, "ours": 1, "stock": 2}

    def __init__(self, mode, process=True):
        if mode not in self._modes:
            raise ValueError(f"flykernels: forced() takes 'ours', 'stock' or None, got {mode!r}")
        self.mode, self.process = self._modes[mode], process

    def __enter__(self):
        ext = _loader.ext
        self.prev = ext.forced_state() if ext is not None else (0, 0)
        if ext is not None:
            ext.set_forced(self.mode)
            if self.process:
                ext.set_forced_process(self.mode)
        return self

    def __exit__(self, *exc):
        ext = _loader.ext
        if ext is not None:
            ext.set_forced(self.prev[0])
            if self.process:
                ext.set_forced_process(self.prev[1])


def time_pair(fn, reps=15, warmup=3, flush=True, modes=("ours", "stock"), process=True):
    """Medians (us) of fn() under forced(modes[0]) and forced(modes[1]) (default: ours, stock; None
    is what the rows decide), interleaved (a, b, b, a, ...), the L2 flushed before each timed call,
    CUDA events on the current stream."""
    for _ in range(warmup):
        for mode in modes:
            with forced(mode, process):
                fn()
    times = {m: [] for m in modes}
    stream = torch.cuda.current_stream()
    for i in range(reps):
        order = modes if i % 2 == 0 else modes[::-1]
        for mode in order:
            if flush:
                _flush_l2()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with forced(mode, process):
                start.record(stream)
                fn()
                end.record(stream)
            end.synchronize()
            times[mode].append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times[modes[0]]), statistics.median(times[modes[1]])


def _op_overload(op, overload):
    ns, name = op.split("::")
    packet = getattr(getattr(torch.ops, ns), name)
    return getattr(packet, overload or "default")


def _split_args(fn, args):
    """The positional and keyword-only parts of a boxed call's arguments (e.g. SDPA's `scale`)."""
    pos, kw = [], {}
    for a, v in zip(fn._schema.arguments, args):
        if a.kwarg_only:
            kw[a.name] = v
        else:
            pos.append(v)
    return pos, kw


def _autotune(key, op, overload, args):
    """The extension's autotune callback: times an unseen key's call both ways, caches the answer
    (memory: the extension; disk: autotune_path()). None where it must not measure."""
    try:
        if torch.cuda.is_current_stream_capturing():
            return None  # a CUDA graph is being captured: the cached or default decision applies
    except RuntimeError:
        return None
    fn = _op_overload(op, overload)
    pos, kw = _split_args(fn, args)
    ours, stock = time_pair(lambda: fn(*pos, **kw), reps=7, warmup=2, process=False)  # this thread's op only
    opname, dtype, layout, *k = key
    row = db_row(device_tag(), opname, dtype, layout, k, ours, stock, torch.cuda.get_device_name())
    try:
        write_rows(autotune_path(), [row])
    except (sqlite3.Error, OSError) as e:
        _warn_once(f"autotune cache {autotune_path()} not written ({type(e).__name__}: {e}); decisions stay in memory")
    return ours, stock


def set_autotune(on):
    if _loader.ext is not None:
        _loader.ext.set_autotune(bool(on), _autotune if on else None)


def decide(op, dtype, layout, *k):
    """(ours?, rule) of a key from the rows (python/csrc/decisions.hpp says each op's key)."""
    if _loader.ext is None:
        return False, "no extension: stock"
    k = [int(v) for v in k] + [0] * (4 - len(k))
    return _loader.ext.decide(op, dtype, layout, *k[:4])
