"""The control path from `shoal scale` to a running launcher: request and answer files in the
job's folder. No socket, so it works the same for a launcher in a terminal and a detached one
(`--detach`), and needs nothing but the job folder both sides already know from the records.

    <job dir>/control/scale-<token>.request     {"role": "worker", "count": 4}   (shoal scale)
    <job dir>/control/scale-<token>.answer      ScaleOutcome.as_json()            (the launcher)
    <job dir>/control/scale-<token>.abandoned   empty                             (shoal scale)

Each file is written whole under a temporary name and renamed into place (atomic on POSIX),
so a reader never sees half of one. The launcher's `ScaleInbox` polls the folder, *claims* a
request by deleting it — only a request it deleted is served, so `withdraw` (the CLI giving
up after its timeout) and the launcher never both act on one — hands it to the supervisor and
writes the answer. A CLI that stops waiting after the launcher claimed its request leaves an
`.abandoned` mark (`abandon`); whichever side comes second — the CLI finding the answer there,
or the launcher finding the mark after it wrote the answer — removes both, so no answer is
left behind whatever the order. Requests and answers are small JSON, validated field by field; nothing is
unpickled. The job folder is private (0700), so only its owner can ask.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from shoal.launch.errors import ScaleError
from shoal.launch.scaling import ScaleOutcome, ScaleRequest

log = logging.getLogger(__name__)

CONTROL_DIR = "control"
_REQUEST = ".request"
_ANSWER = ".answer"
_ABANDONED = ".abandoned"
_MAX_BYTES = 64 * 1024
_MAX_COUNT = 100_000
POLL_S = 0.2
"""How often the launcher looks for requests."""


def control_dir(job_dir: str | Path) -> Path:
    return Path(job_dir) / CONTROL_DIR


def submit(job_dir: str | Path, request: ScaleRequest) -> str:
    """Write `request` for the launcher of the job in `job_dir`; its token (for `wait_answer`).
    Blocks on the file write only; thread-safe."""
    token = secrets.token_hex(8)
    folder = control_dir(job_dir)
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
    except OSError as e:
        raise ScaleError(f"cannot write a request into the job's folder {folder}: {e.strerror or e};"
                         " run shoal scale as the user that started the job") from e
    _write_atomic(folder / f"scale-{token}{_REQUEST}",
                  {"role": request.role, "count": request.count})
    return token


def withdraw(job_dir: str | Path, token: str) -> bool:
    """Take back a request the launcher has not claimed; True if it was still there (then
    the launcher never acts on it). Idempotent."""
    try:
        os.unlink(control_dir(job_dir) / f"scale-{token}{_REQUEST}")
        return True
    except FileNotFoundError:
        return False


def abandon(job_dir: str | Path, token: str) -> Optional[ScaleOutcome]:
    """Stop waiting for the answer to a request the launcher claimed (`withdraw` was False):
    the answer if it is there already, else None, and the launcher removes the answer it
    writes later (see the module docstring). Blocks on file I/O only; idempotent."""
    mark = control_dir(job_dir) / f"scale-{token}{_ABANDONED}"
    try:
        mark.touch(mode=0o600)
    except OSError as e:
        log.warning("cannot mark scale request %s as abandoned: %s", token, e)
    try:
        answer = read_answer(job_dir, token)
    except ScaleError:
        answer = None  # damaged: read_answer left it, so remove it here
        _remove(control_dir(job_dir) / f"scale-{token}{_ANSWER}")
    if answer is not None:
        _remove(mark)
    return answer


def read_answer(job_dir: str | Path, token: str) -> Optional[ScaleOutcome]:
    """The launcher's answer to request `token`, if it wrote one (the file is then removed);
    ScaleError for an answer that does not parse."""
    path = control_dir(job_dir) / f"scale-{token}{_ANSWER}"
    try:
        data = _read_json(path)
    except FileNotFoundError:
        return None
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    try:
        return ScaleOutcome.from_json(data)
    except ValueError as e:
        raise ScaleError(f"the launcher's answer in {path} is damaged: {e}") from e


def wait_answer(job_dir: str | Path, token: str, timeout: float,
                keep_waiting: Callable[[], bool], poll: float = 0.05) -> Optional[ScaleOutcome]:
    """Poll for the answer to `token` until it comes, `timeout` seconds pass, or
    `keep_waiting()` says False (the job ended); None if it did not come. Blocks (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        answer = read_answer(job_dir, token)
        if answer is not None:
            return answer
        if time.monotonic() >= deadline or not keep_waiting():
            return read_answer(job_dir, token)
        time.sleep(poll)


Serve = Callable[[ScaleRequest, Callable[[ScaleOutcome], None]], None]
"""How the inbox hands a request on: (request, reply) — the supervisor's `request_scale`."""


class ScaleInbox:
    """The launcher's side: polls `<job_dir>/control` every POLL_S seconds on a thread of its
    own, claims each request, hands it to `serve` and writes the answer `serve`'s reply gets
    (from whatever thread calls it). The constructor does no I/O; `start` once; `close` is
    idempotent and thread-safe."""

    def __init__(self, job_dir: str | Path, serve: Serve, poll: float = POLL_S) -> None:
        self._folder = control_dir(job_dir)
        self._serve = serve
        self._poll = poll
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        """Start polling (a daemon thread). Never blocks."""
        self._thread = threading.Thread(target=self._loop, name="scale-inbox", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop polling; requests not claimed yet stay (the CLI sees the job end and withdraws)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    def poll_once(self) -> int:
        """Claim and hand on every request there now; how many. Blocks on file I/O only."""
        try:
            names = sorted(p.name for p in self._folder.iterdir() if p.name.endswith(_REQUEST))
        except FileNotFoundError:
            return 0
        served = 0
        for name in names:
            token = name[len("scale-"):-len(_REQUEST)]
            path = self._folder / name
            try:
                data = _read_json(path)
                path.unlink()  # the claim: a request the CLI withdrew first is not served
            except FileNotFoundError:
                continue
            except (OSError, ScaleError) as e:
                log.warning("scale request %s is unreadable: %s", name, e)
                _remove(path)
                self._answer(token, ScaleOutcome("?", 0, error=f"the request could not be read: {e}"))
                continue
            try:
                request = _parse_request(data)
            except ScaleError as e:
                self._answer(token, ScaleOutcome(str(data.get("role", "?")) if isinstance(data, dict)
                                                 else "?", 0, error=str(e)))
                continue
            self._serve(request, lambda outcome, token=token: self._answer(token, outcome))
            served += 1
        return served

    def _loop(self) -> None:
        while not self._stop.wait(self._poll):
            try:
                self.poll_once()
            except OSError as e:  # the job folder went away (prune): nothing to serve
                log.warning("cannot read scale requests in %s: %s", self._folder, e)

    def _answer(self, token: str, outcome: ScaleOutcome) -> None:
        path = self._folder / f"scale-{token}{_ANSWER}"
        try:
            _write_atomic(path, outcome.as_json())
        except (OSError, ScaleError) as e:
            log.warning("cannot answer scale request %s: %s", token, e)
            return
        mark = self._folder / f"scale-{token}{_ABANDONED}"
        if mark.exists():  # the CLI stopped waiting: nobody will read it (after the write: no race)
            _remove(path)
            _remove(mark)


def _parse_request(data: Any) -> ScaleRequest:
    if not isinstance(data, dict):
        raise ScaleError(f"a scale request must be a JSON object, not {data!r:.80}")
    role, count = data.get("role"), data.get("count")
    if not isinstance(role, str) or not role:
        raise ScaleError(f"a scale request's role must be a role name, not {role!r:.40}")
    if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= _MAX_COUNT:
        raise ScaleError(f"a scale request's count must be a whole number 0..{_MAX_COUNT},"
                         f" not {count!r:.40}")
    return ScaleRequest(role, count)


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError as e:
        _remove(tmp)
        raise ScaleError(f"cannot write {path}: {e.strerror or e}; check the job's folder"
                         " (SHOAL_HOME) can be written") from e


def _read_json(path: Path) -> Any:
    """The JSON in `path`; FileNotFoundError if it is gone, ScaleError if it is not JSON."""
    with open(path, "rb") as f:
        text = f.read(_MAX_BYTES + 1)
    if len(text) > _MAX_BYTES:
        raise ScaleError(f"{path} is over {_MAX_BYTES} bytes; not a scale request")
    try:
        return json.loads(text)
    except ValueError as e:
        raise ScaleError(f"{path} is not JSON: {e}") from e


def _remove(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
