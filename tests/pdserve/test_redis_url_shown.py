"""A Redis URL fit to print: `pdserve up` shows the one it was given, or the one of the Redis it
started, with the password, whichever way the URL carries it, as ***."""
import pytest

from pdserve.redis_process import without_password


@pytest.mark.parametrize("url, shown", [
    ("redis://:s3cret@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
    ("rediss://user:s3cret@cache.example:6380/2", "rediss://user:***@cache.example:6380/2"),
    ("redis://:p@ss@host:1/0", "redis://:***@host:1/0"),  # an @ in the password: the host's is the last
    ("redis://host:6379/0?password=s3cret&db=1", "redis://host:6379/0?password=***&db=1"),
    ("unix:///run/redis.sock?password=s3cret", "unix:///run/redis.sock?password=***"),
    ("redis://user@host:6379/0", "redis://user@host:6379/0"),
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
])
def test_the_password_is_never_shown_and_the_rest_is_kept(url, shown):
    assert without_password(url) == shown
