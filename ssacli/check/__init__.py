"""``ssacli check``: requirements on a diagnosis, as a CI gate."""

JUNIT_SUITE = "ssacli check"  # the <testsuite> name of `check --junit`: how ssacli knows its own file
