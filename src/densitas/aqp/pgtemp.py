"""A throw-away PostgreSQL server in a temporary directory, for tests and benchmarks.

:class:`TempPostgres` runs ``initdb`` into a fresh temporary directory, starts ``postgres`` listening only on a
Unix socket in that directory (no TCP port, so servers of parallel test workers never collide) and removes
everything on :meth:`~TempPostgres.stop`. The server binaries come from, in order:

1. the directory named by the environment variable ``DENSITAS_PG_BINDIR``;
2. the PyPI package ``pgserver`` (a wheel that ships PostgreSQL 16's binaries; the ``test`` extra installs it,
   so ``make test`` needs neither root nor a system package);
3. ``pg_config --bindir`` and Debian's ``/usr/lib/postgresql/<version>/bin`` (``apt-get install postgresql``).

PostgreSQL refuses to run as root: when this process is root, the server runs as the unprivileged user
``nobody`` and the temporary directory is handed to it.

Durability is off (``fsync``, ``synchronous_commit``, ``full_page_writes``): the data dies with the directory.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from densitas.exceptions import DatabaseError

__all__ = ["TempPostgres", "find_bindir"]

_NEEDED = ("initdb", "pg_ctl", "postgres")
#: settings of every temporary server (durability off: the data lives only as long as the directory)
FAST_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off", "listen_addresses": "''"}


def _has_server(d: Path) -> bool:
    return all((d / exe).is_file() for exe in _NEEDED)


def find_bindir() -> Path:
    """The directory of PostgreSQL's server binaries (``initdb``, ``pg_ctl``, ``postgres``).

    Raises
    ------
    DatabaseError
        None is found; the message says how to install one.

    Examples
    --------
    >>> (find_bindir() / "initdb").is_file()
    True
    """
    candidates: list[Path] = []
    if os.environ.get("DENSITAS_PG_BINDIR"):
        candidates.append(Path(os.environ["DENSITAS_PG_BINDIR"]))
    spec = importlib.util.find_spec("pgserver")  # located, not imported: its import has side effects
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / "pginstall" / "bin" for p in spec.submodule_search_locations]
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True)
            candidates.append(Path(out.stdout.strip()))
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    for d in candidates:
        if _has_server(d):
            return d
    raise DatabaseError("no PostgreSQL server binaries found (looked in DENSITAS_PG_BINDIR, the pgserver package, "
                        "pg_config --bindir and /usr/lib/postgresql/*/bin): `pip install pgserver` or "
                        "`apt-get install postgresql`.")


@dataclass
class TempPostgres:
    """A PostgreSQL server in a temporary directory (a context manager: started on entry, removed on exit).

    Parameters
    ----------
    settings : dict
        Server settings (``postgres -c name=value``) on top of :data:`FAST_SETTINGS`, e.g. ``{"work_mem":
        "64MB"}``.

    Examples
    --------
    >>> import psycopg
    >>> with TempPostgres() as pg:
    ...     with psycopg.connect(pg.url) as con:
    ...         print(con.execute("SELECT 40 + 2").fetchone()[0])
    42
    """

    settings: dict = field(default_factory=dict)
    bindir: Path | None = None
    root: Path | None = None  # the temporary directory: data/, the socket, log
    port: int = 5432  # names the socket file only (no TCP)

    @property
    def url(self) -> str:
        """The connection URL (user ``postgres``, database ``postgres``, over the Unix socket)."""
        return f"postgresql://postgres@/postgres?host={self.root}&port={self.port}"

    def url_for(self, database: str) -> str:
        """The connection URL of another database of this server."""
        return f"postgresql://postgres@/{database}?host={self.root}&port={self.port}"

    def _run(self, *args: str, user: str | None) -> None:
        try:
            subprocess.run(list(args), check=True, capture_output=True, text=True, timeout=120, user=user)
        except subprocess.CalledProcessError as exc:
            log = (self.root / "log") if self.root else None
            tail = log.read_text()[-2000:] if log is not None and log.is_file() else ""
            raise DatabaseError(f"{Path(args[0]).name} failed ({exc.returncode}): {exc.stderr.strip()[-2000:]} "
                                f"{tail}".strip()) from None

    def start(self) -> TempPostgres:
        """``initdb`` into a new temporary directory and start the server; returns self."""
        self.bindir = self.bindir or find_bindir()
        self.root = Path(tempfile.mkdtemp(prefix="densitas-pg-"))
        user = None
        if hasattr(os, "geteuid") and os.geteuid() == 0:  # postgres refuses root: run it as nobody
            import pwd

            user = "nobody"
            pw = pwd.getpwnam(user)
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self._user = user
        data = self.root / "data"
        self._run(str(self.bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                  "--no-sync", "--locale=C", user=user)
        opts = {**FAST_SETTINGS, **self.settings, "unix_socket_directories": f"'{self.root}'", "port": str(self.port)}
        self._run(str(self.bindir / "pg_ctl"), "-D", str(data), "-l", str(self.root / "log"), "-w", "-t", "60",
                  "-o", " ".join(f"-c {k}={v}" for k, v in opts.items()), "start", user=user)
        return self

    def stop(self) -> None:
        """Stop the server and remove its directory."""
        if self.root is None:
            return
        try:
            if (self.root / "data" / "postmaster.pid").exists():
                self._run(str(self.bindir / "pg_ctl"), "-D", str(self.root / "data"), "-m", "fast", "-w", "stop",
                          user=self._user)
        finally:
            for _ in range(3):
                shutil.rmtree(self.root, ignore_errors=True)
                if not self.root.exists():
                    break
                time.sleep(0.2)
            self.root = None

    def __enter__(self) -> TempPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
