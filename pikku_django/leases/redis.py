"""The Redis lease backend, through a django-redis cache alias.

Each operation is one Lua script, so it is atomic and judged on Redis's own
``TIME``. A lease is a hash Redis expires by itself; its token counter is a
separate key that outlives release. Both share the ``{key}`` hash tag, so they
live in one cluster slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from redis.exceptions import NoScriptError

from pikku_django.leases.base import (
    Lease,
    LeaseService,
    check_holder,
    check_key,
    check_lease,
    check_ttl,
)

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: lease hash, token counter. ARGV: holder, ttl_ms. Returns {token, expires_at} or nil.
ACQUIRE = (
    _NOW
    + """
local ttl = tonumber(ARGV[2])
local cur = redis.call('HMGET', KEYS[1], 'holder', 'token', 'expires_at')
local token
if cur[1] and tonumber(cur[3]) > now then
  if cur[1] ~= ARGV[1] then return nil end
  token = tonumber(cur[2])
else
  token = redis.call('INCR', KEYS[2])
end
local expires_at = now + ttl
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', token,
           'expires_at', string.format('%.0f', expires_at))
redis.call('PEXPIRE', KEYS[1], ttl)
return {token, expires_at}
"""
)

# KEYS: lease hash. ARGV: holder, token, ttl_ms. Returns expires_at or nil.
REFRESH = (
    _NOW
    + """
local ttl = tonumber(ARGV[3])
local cur = redis.call('HMGET', KEYS[1], 'holder', 'token', 'expires_at')
if not cur[1] or cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] or tonumber(cur[3]) <= now then
  return nil
end
local expires_at = now + ttl
redis.call('HSET', KEYS[1], 'expires_at', string.format('%.0f', expires_at))
redis.call('PEXPIRE', KEYS[1], ttl)
return expires_at
"""
)

# KEYS: lease hash. ARGV: holder, token. Returns 1 when released: only a live lease,
# judged as acquire, refresh and get judge it (Redis may not have expired the hash yet).
RELEASE = (
    _NOW
    + """
local cur = redis.call('HMGET', KEYS[1], 'holder', 'token', 'expires_at')
if cur[1] == ARGV[1] and cur[2] == ARGV[2] and tonumber(cur[3]) > now then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""
)

# KEYS: lease hash. Returns {holder, token, expires_at} or nil.
GET = (
    _NOW
    + """
local cur = redis.call('HMGET', KEYS[1], 'holder', 'token', 'expires_at')
if not cur[1] or tonumber(cur[3]) <= now then return nil end
return {cur[1], tonumber(cur[2]), tonumber(cur[3])}
"""
)


def redis_client_for_cache(alias: str) -> Any:
    """The redis-py client behind a django-redis cache alias."""
    from django.conf import settings

    if not alias:
        raise ImproperlyConfigured(
            "The redis lease backend needs a django-redis cache: set PIKKU['LEASE_CACHE'] "
            "to an alias in CACHES whose BACKEND is 'django_redis.cache.RedisCache'."
        )
    if alias not in settings.CACHES:
        raise ImproperlyConfigured(
            f"PIKKU['LEASE_CACHE'] is {alias!r}, which is not an alias in CACHES."
        )
    try:
        from django_redis import get_redis_connection
    except ImportError as exc:
        raise ImproperlyConfigured(
            "The redis lease backend needs django-redis: pip install 'pikku-django[redis]'."
        ) from exc
    try:
        return get_redis_connection(alias)
    except NotImplementedError as exc:
        raise ImproperlyConfigured(
            f"CACHES[{alias!r}] is not a django-redis cache; the redis lease backend needs "
            "BACKEND 'django_redis.cache.RedisCache'."
        ) from exc


class RedisLeaseService(LeaseService):
    """Leases in Redis, judged on the Redis server's clock.

    Give it a django-redis cache ``alias`` (``PIKKU['LEASE_CACHE']``) or, outside
    settings, a redis-py ``client``.
    """

    shared_between_processes = True
    judged_on_store_clock = True

    def __init__(
        self,
        alias: str | None = None,
        *,
        client: Any = None,
        prefix: str = "pikku:lease:",
    ) -> None:
        if client is None:
            client = redis_client_for_cache(alias or "")
        if not isinstance(prefix, str):
            raise ValueError("PIKKU['LEASE_KEY_PREFIX'] must be a str")
        self.client = client
        self.prefix = prefix
        self._scripts = {
            name: client.register_script(text)
            for name, text in (
                ("acquire", ACQUIRE),
                ("refresh", REFRESH),
                ("release", RELEASE),
                ("get", GET),
            )
        }

    def _run(self, name: str, keys: list[str], *args: Any) -> Any:
        """EVALSHA the script straight through the client, loading it once if Redis lost it."""
        script = self._scripts[name]
        try:
            return self.client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        except NoScriptError:
            script.sha = self.client.script_load(script.script)
            return self.client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)

    def _key(self, key: str) -> str:
        return f"{self.prefix}{{{key}}}"

    def forget(self, keys: Sequence[str]) -> int:
        names = [self._key(check_key(key)) for key in keys]
        if not names:
            return 0
        self.client.delete(*(n + ":token" for n in names))
        return int(self.client.delete(*names))

    def acquire(self, key: str, holder: str, ttl_ms: int) -> Lease | None:
        check_key(key)
        check_holder(holder)
        check_ttl(ttl_ms)
        name = self._key(key)
        row = self._run("acquire", [name, name + ":token"], holder, ttl_ms)
        return None if row is None else Lease(key, holder, int(row[0]), int(row[1]))

    def refresh(self, lease: Lease, ttl_ms: int) -> Lease | None:
        check_lease(lease)
        check_ttl(ttl_ms)
        expires_at = self._run("refresh", [self._key(lease.key)], lease.holder, lease.token, ttl_ms)
        if expires_at is None:
            return None
        return Lease(lease.key, lease.holder, lease.token, int(expires_at))

    def release(self, lease: Lease) -> bool:
        check_lease(lease)
        return bool(self._run("release", [self._key(lease.key)], lease.holder, lease.token))

    def get(self, key: str) -> Lease | None:
        check_key(key)
        row = self._run("get", [self._key(key)])
        if row is None:
            return None
        holder = row[0].decode() if isinstance(row[0], bytes) else row[0]
        return Lease(key, holder, int(row[1]), int(row[2]))
