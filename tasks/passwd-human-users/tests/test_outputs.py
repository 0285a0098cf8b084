"""Outcome checks: exact list from /data/passwd (not /etc/passwd), numeric uid order."""


def test_users():
    with open("/app/users.txt") as fh:
        got = [line.strip() for line in fh if line.strip()]
    assert got == [
        "alice:1000:/home/alice",
        "bob:1001:/home/bob",
        "gitlab-runner:1004:/home/gitlab-runner",
        "judy:1005:/home/judy",
        "heidi:2000:/home/heidi",
        "eve:10010:/home/eve",
    ]
