"""A simulated Redis node: an in-memory store that runs our real Lua scripts.

Only what aiolock sends is implemented (the commands below, and those its scripts call),
with Redis 7's semantics: lazy expiry by the node's own clock (which may run fast or
slow), ``PTTL`` -2/-1, ``SET ... NX/XX/PX/GET``, sorted sets with ``(`` and ``±inf``
bounds, pub/sub (plain and sharded), ``EVALSHA``/``NOSCRIPT``, ``INFO server`` with a
``run_id`` and an ``uptime_in_seconds``. The scripts run on Lua 5.1 (lupa), as in Redis,
with ``redis.call``/``pcall``/``error_reply``/``status_reply``/``sha1hex`` and Redis's
conversions both ways. A script sees one instant of the node's clock, as in Redis 7.

Why not fakeredis: its clock is the process's (a node here has its own, drifting), its
scripts cannot be paused or restarted per node, and each of its commands costs more than
this whole store needs; the differential test (tests/test_sim.py) runs one sequence of
our scripts against this store and a real server and compares every reply.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Callable
from typing import Any

from lupa import lua51  # type: ignore[import-untyped]

Reply = Any  # bytes | int | None | list | Status | Error


class Status(bytes):
    """A simple-string reply (``+OK``)."""


class Error(Exception):
    """An error reply (``-ERR ...``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"


def encode(reply: Reply) -> bytes:
    """RESP2 bytes of a reply."""
    if isinstance(reply, Status):
        return b"+" + bytes(reply) + b"\r\n"
    if isinstance(reply, Error):
        return b"-" + reply.message.encode() + b"\r\n"
    if reply is None:
        return b"$-1\r\n"
    if isinstance(reply, bool):
        return b":%d\r\n" % int(reply)
    if isinstance(reply, int):
        return b":%d\r\n" % reply
    if isinstance(reply, bytes):
        return b"$%d\r\n%s\r\n" % (len(reply), reply)
    if isinstance(reply, list):
        return b"*%d\r\n" % len(reply) + b"".join(encode(r) for r in reply)
    raise TypeError(f"cannot encode {reply!r}")  # pragma: no cover - a bug of the store


def _score(value: bytes) -> float:
    text = value.lower()
    if text in (b"+inf", b"inf"):
        return math.inf
    if text == b"-inf":
        return -math.inf
    try:
        return float(value)
    except ValueError:
        raise Error("ERR value is not a valid float") from None


def _format_score(score: float) -> bytes:
    if score == math.inf:
        return b"inf"
    if score == -math.inf:
        return b"-inf"
    if score == int(score) and abs(score) < 1e17:
        return b"%d" % int(score)
    return repr(score).encode()


def _bound(value: bytes) -> tuple[float, bool]:
    """A ZRANGEBYSCORE bound: (score, exclusive)."""
    if value.startswith(b"("):
        return _score(value[1:]), True
    return _score(value), False


class ZSet:
    """A sorted set: member -> score, and (score, member) kept sorted."""

    __slots__ = ("order", "scores")

    def __init__(self) -> None:
        self.scores: dict[bytes, float] = {}
        self.order: list[tuple[float, bytes]] = []

    def add(self, member: bytes, score: float) -> None:
        old = self.scores.get(member)
        if old is not None:
            self.order.remove((old, member))
        self.scores[member] = score
        bisect.insort(self.order, (score, member))

    def remove(self, member: bytes) -> bool:
        old = self.scores.pop(member, None)
        if old is None:
            return False
        self.order.remove((old, member))
        return True


# -- Lua ---------------------------------------------------------------------------

_MAKE_ENV = """
function(call, pcall, sha1hex)
    local redis = {}
    redis.call = function(...) local ok, r = call(...) if ok then return r end error(r, 0) end
    redis.pcall = function(...) local ok, r = call(...) if ok then return r end return {err=r} end
    redis.error_reply = function(message) return {err=message} end
    redis.status_reply = function(message) return {ok=message} end
    redis.sha1hex = sha1hex
    return redis
end
"""
# A script is compiled once per source, as a function of (KEYS, ARGV): Redis's globals
# become its upvalues through a small wrapper; the body is the script as shipped.
_COMPILE = """
function(source, redis)
    local chunk, err = loadstring(source, '@user_script')
    if not chunk then return nil, err end
    return function(keys, argv)
        local env = {KEYS=keys, ARGV=argv, redis=redis}
        setmetatable(env, {__index=_G})
        setfenv(chunk, env)
        return chunk()
    end, nil
end
"""


class _Lua:
    """A Lua state of its own for each store, and the helpers bound to it.

    A store, its scripts and its Lua state refer to each other (the scripts call back
    into the store): Python's collector frees the three together once the run is over.
    One state shared by every run kept every run's stores alive instead (it holds what
    Lua refers to): about 0.4 MB a schedule, a search worker at 4 GiB after some
    thousands of them, and then a Lua panic that killed the worker and hung the pool.
    """

    __slots__ = ("compile", "make_env", "run", "table", "type")

    def __init__(self) -> None:
        runtime = lua51.LuaRuntime(encoding=None, unpack_returned_tuples=True)
        self.table: Callable[..., Any] = runtime.table
        self.type: Callable[[Any], Any] = runtime.eval("type")
        self.make_env: Callable[..., Any] = runtime.eval(_MAKE_ENV)
        self.compile: Callable[..., Any] = runtime.eval(_COMPILE)
        self.run: Callable[..., Any] = runtime.eval(
            "function(f, keys, argv) return pcall(f, keys, argv) end"
        )


def _to_lua(lua: _Lua, reply: Reply) -> Any:
    """A command's reply as a script sees it (Redis's RESP2 -> Lua conversion)."""
    if reply is None:
        return False
    if isinstance(reply, Status):
        return lua.table(ok=bytes(reply))
    if isinstance(reply, bool):
        return int(reply)
    if isinstance(reply, int | bytes):
        return reply
    if isinstance(reply, list):
        return lua.table(*(_to_lua(lua, r) for r in reply))
    raise TypeError(f"cannot convert {reply!r}")  # pragma: no cover


def _from_lua(lua: _Lua, value: Any) -> Reply:
    """A script's return value as the client gets it (Lua -> RESP2)."""
    if value is None or value is False:
        return None
    if value is True:
        return 1
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)  # Redis truncates a Lua number to an integer
    if isinstance(value, bytes):
        return value
    if lua.type(value) == b"table":
        err = value[b"err"]
        if err is not None:
            return Error(err.decode() if isinstance(err, bytes) else str(err))
        ok = value[b"ok"]
        if ok is not None:
            return Status(ok)
        items = []
        i = 1
        while True:
            item = value[i]
            if item is None:
                break
            items.append(_from_lua(lua, item))
            i += 1
        return items
    return None


def _sha1hex(source: bytes) -> bytes:
    return hashlib.sha1(source).hexdigest().encode()  # noqa: S324 - Redis's script ids


class Store:
    """A node's data and scripts; ``clock()`` is the node's time in milliseconds."""

    def __init__(
        self, clock: Callable[[], float], publish: Callable[[bytes, bytes, bool], int]
    ) -> None:
        self.clock = clock
        self.publish = publish
        self.data: dict[bytes, Any] = {}
        self.expires: dict[bytes, float] = {}
        self.scripts: dict[bytes, Any] = {}
        self._now: float | None = None  # frozen while a script runs
        self._lua = _Lua()
        self._redis = self._lua.make_env(self._lua_call, None, _sha1hex)
        self.commands: dict[bytes, Callable[[list[bytes]], Reply]] = {
            b"GET": self.get,
            b"SET": self.set,
            b"DEL": self.delete,
            b"EXISTS": self.exists,
            b"PEXPIRE": self.pexpire,
            b"PTTL": self.pttl,
            b"TYPE": self.type,
            b"TIME": self.time,
            b"SADD": self.sadd,
            b"SREM": self.srem,
            b"SMEMBERS": self.smembers,
            b"ZADD": self.zadd,
            b"ZREM": self.zrem,
            b"ZCARD": self.zcard,
            b"ZRANGE": self.zrange,
            b"ZRANGEBYSCORE": self.zrangebyscore,
            b"PUBLISH": lambda a: self.publish(a[1], a[2], False),
            b"SPUBLISH": lambda a: self.publish(a[1], a[2], True),
            b"EVAL": self.eval,
            b"EVALSHA": self.evalsha,
            b"SCRIPT": self.script,
            b"PING": lambda a: Status(b"PONG"),
        }

    def flush(self) -> None:
        """Everything gone: a restart without persistence."""
        self.data.clear()
        self.expires.clear()
        self.scripts.clear()

    # -- the keyspace ------------------------------------------------------------------

    def now(self) -> float:
        return self.clock() if self._now is None else self._now

    def _alive(self, key: bytes) -> bool:
        when = self.expires.get(key)
        if when is not None and self.now() > when:
            del self.expires[key]
            del self.data[key]
            return False
        return key in self.data

    def _get(self, key: bytes, kind: type) -> Any:
        if not self._alive(key):
            return None
        value = self.data[key]
        if not isinstance(value, kind):
            raise Error(WRONGTYPE)
        return value

    def _delete(self, key: bytes) -> bool:
        if not self._alive(key):
            return False
        del self.data[key]
        self.expires.pop(key, None)
        return True

    def keys(self) -> dict[bytes, float | None]:
        """Every live key and its expiry (node milliseconds), for the checker."""
        return {k: self.expires.get(k) for k in list(self.data) if self._alive(k)}

    # -- commands ----------------------------------------------------------------------

    def execute(self, args: list[bytes]) -> Reply:
        handler = self.commands.get(args[0].upper())
        if handler is None:
            return Error(f"ERR unknown command '{args[0].decode()}'")
        try:
            return handler(args)
        except Error as exc:
            return exc
        except (IndexError, ValueError):
            return Error(f"ERR wrong number of arguments for '{args[0].decode().lower()}' command")

    def get(self, a: list[bytes]) -> Reply:
        return self._get(a[1], bytes)

    def set(self, a: list[bytes]) -> Reply:
        key, value = a[1], a[2]
        nx = xx = get = keepttl = False
        px: float | None = None
        ifeq: bytes | None = None
        i = 3
        while i < len(a):
            option = a[i].upper()
            if option == b"IFEQ":  # (Valkey 8.1, Redis 8.4: set only over this value)
                i += 1
                ifeq = a[i]
            elif option == b"NX":
                nx = True
            elif option == b"XX":
                xx = True
            elif option == b"GET":
                get = True
            elif option == b"KEEPTTL":
                keepttl = True
            elif option in (b"PX", b"EX"):
                i += 1
                amount = int(a[i])
                if amount <= 0:
                    return Error("ERR invalid expire time in 'set' command")
                px = amount * (1000 if option == b"EX" else 1)
            else:
                return Error("ERR syntax error")
            i += 1
        if ifeq is not None and (nx or xx):
            return Error("ERR syntax error")
        old = self._get(key, bytes) if get or ifeq is not None else None
        exists = self._alive(key)
        if (nx and exists) or (xx and not exists) or (ifeq is not None and old != ifeq):
            return old if get else None
        self.data[key] = value
        if px is not None:
            self.expires[key] = self.now() + px
        elif not keepttl:
            self.expires.pop(key, None)
        return old if get else Status(b"OK")

    def delete(self, a: list[bytes]) -> Reply:
        return sum(self._delete(k) for k in a[1:])

    def exists(self, a: list[bytes]) -> Reply:
        return sum(self._alive(k) for k in a[1:])

    def pexpire(self, a: list[bytes]) -> Reply:
        key, ms = a[1], int(a[2])
        if not self._alive(key):
            return 0
        if ms <= 0:
            self._delete(key)
        else:
            self.expires[key] = self.now() + ms
        return 1

    def pttl(self, a: list[bytes]) -> Reply:
        key = a[1]
        if not self._alive(key):
            return -2
        when = self.expires.get(key)
        if when is None:
            return -1
        return max(0, round(when - self.now()))

    def type(self, a: list[bytes]) -> Reply:
        if not self._alive(a[1]):
            return Status(b"none")
        value = self.data[a[1]]
        kind = {bytes: b"string", set: b"set", ZSet: b"zset"}[type(value)]
        return Status(kind)

    def time(self, a: list[bytes]) -> Reply:
        us = int(self.now() * 1000)
        return [b"%d" % (us // 1_000_000), b"%d" % (us % 1_000_000)]

    def sadd(self, a: list[bytes]) -> Reply:
        members = self._get(a[1], set)
        if members is None:
            members = self.data[a[1]] = set()
        before = len(members)
        members.update(a[2:])
        return len(members) - before

    def srem(self, a: list[bytes]) -> Reply:
        members = self._get(a[1], set)
        if members is None:
            return 0
        removed = sum(1 for m in a[2:] if m in members)
        members.difference_update(a[2:])
        if not members:
            self._delete(a[1])
        return removed

    def smembers(self, a: list[bytes]) -> Reply:
        members = self._get(a[1], set)
        return sorted(members) if members else []

    def zadd(self, a: list[bytes]) -> Reply:
        i, nx, xx, incr = 2, False, False, False
        while a[i].upper() in (b"NX", b"XX", b"INCR"):
            option = a[i].upper()
            nx, xx, incr = nx or option == b"NX", xx or option == b"XX", incr or option == b"INCR"
            i += 1
        pairs = a[i:]
        if not pairs or len(pairs) % 2:
            return Error("ERR syntax error")
        if incr and len(pairs) != 2:
            return Error("ERR INCR option supports a single increment-element pair")
        zset = self._get(a[1], ZSet)
        if incr:  # (as ZINCRBY: the new score, or nil where NX or XX left it alone)
            by, member = _score(pairs[0]), pairs[1]
            exists = zset is not None and member in zset.scores
            if (nx and exists) or (xx and not exists):
                return None
            if zset is None:
                zset = self.data[a[1]] = ZSet()
            zset.add(member, zset.scores.get(member, 0.0) + by)
            return _format_score(zset.scores[member])
        if zset is None:
            if xx:
                return 0
            zset = self.data[a[1]] = ZSet()
        added = 0
        for score, member in zip(pairs[::2], pairs[1::2], strict=True):
            exists = member in zset.scores
            if (nx and exists) or (xx and not exists):
                continue
            added += not exists
            zset.add(member, _score(score))
        if not zset.scores:
            self._delete(a[1])
        return added

    def zrem(self, a: list[bytes]) -> Reply:
        zset = self._get(a[1], ZSet)
        if zset is None:
            return 0
        removed = sum(zset.remove(m) for m in a[2:])
        if not zset.scores:
            self._delete(a[1])
        return removed

    def zcard(self, a: list[bytes]) -> Reply:
        zset = self._get(a[1], ZSet)
        return 0 if zset is None else len(zset.scores)

    @staticmethod
    def _pairs(items: list[tuple[float, bytes]], scores: bool) -> list[bytes]:
        if not scores:
            return [m for _s, m in items]
        return [x for s, m in items for x in (m, _format_score(s))]

    def zrange(self, a: list[bytes]) -> Reply:
        zset = self._get(a[1], ZSet)
        scores = len(a) > 4 and a[4].upper() == b"WITHSCORES"
        if zset is None:
            return []
        n = len(zset.order)
        start, stop = int(a[2]), int(a[3])
        start, stop = (start + n if start < 0 else start), (stop + n if stop < 0 else stop)
        start, stop = max(start, 0), min(stop, n - 1)
        if start > stop:
            return []
        return self._pairs(zset.order[start : stop + 1], scores)

    def zrangebyscore(self, a: list[bytes]) -> Reply:
        zset = self._get(a[1], ZSet)
        (low, low_open), (high, high_open) = _bound(a[2]), _bound(a[3])
        scores, offset, count = False, 0, -1
        i = 4
        while i < len(a):
            option = a[i].upper()
            if option == b"WITHSCORES":
                scores = True
                i += 1
            elif option == b"LIMIT":
                offset, count = int(a[i + 1]), int(a[i + 2])
                i += 3
            else:
                return Error("ERR syntax error")
        if zset is None:
            return []
        items = [
            (s, m)
            for s, m in zset.order
            if (s > low if low_open else s >= low) and (s < high if high_open else s <= high)
        ]
        items = items[offset:] if count < 0 else items[offset : offset + count]
        return self._pairs(items, scores)

    # -- scripts -----------------------------------------------------------------------

    def script(self, a: list[bytes]) -> Reply:
        sub = a[1].upper()
        if sub == b"LOAD":
            sha = _sha1hex(a[2])
            if sha not in self.scripts:
                function, err = self._lua.compile(a[2], self._redis)
                if function is None:
                    return Error(f"ERR Error compiling script (new function): {err!r}")
                self.scripts[sha] = function
            return sha
        if sub == b"FLUSH":
            self.scripts.clear()
            return Status(b"OK")
        return Error("ERR unknown SCRIPT subcommand")

    def eval(self, a: list[bytes]) -> Reply:
        sha = self.script([b"SCRIPT", b"LOAD", a[1]])
        if isinstance(sha, Error):
            return sha
        return self._call_script(self.scripts[sha], a[2:])

    def evalsha(self, a: list[bytes]) -> Reply:
        function = self.scripts.get(a[1].lower())
        if function is None:
            return Error("NOSCRIPT No matching script. Please use EVAL.")
        return self._call_script(function, a[2:])

    def _call_script(self, function: Any, rest: list[bytes]) -> Reply:
        numkeys = int(rest[0])
        keys, argv = rest[1 : 1 + numkeys], rest[1 + numkeys :]
        self._now = self.clock()
        try:
            lua = self._lua
            ok, result = lua.run(function, lua.table(*keys), lua.table(*argv))
        finally:
            self._now = None
        if not ok:
            message = result.decode() if isinstance(result, bytes) else str(result)
            return Error(message if message[:1].isupper() else f"ERR user_script: {message}")
        return _from_lua(self._lua, result)

    def _lua_call(self, *args: Any) -> tuple[bool, Any]:
        items = [
            item
            if isinstance(item, bytes)
            else b"%d" % item
            if isinstance(item, int)
            else b"%.17g" % item
            for item in args
        ]
        if not items:
            return False, b"ERR Please specify at least one argument for this redis lib call"
        name = items[0].upper()
        if name in (b"EVAL", b"EVALSHA", b"SCRIPT"):
            return False, b"ERR This Redis command is not allowed from script"
        reply = self.execute(items)
        if isinstance(reply, Error):
            return False, reply.message.encode()
        return True, _to_lua(self._lua, reply)
