"""Scenario modules. Each module defines ``scenarios(quick: bool)`` yielding ``(name, run)`` pairs,
where ``run()`` returns a dict of figures that includes ``"passed": bool``. Names start with the
plane they test: ``timing-``, ``dispatch-``, ``policy-``, ``trust-``."""
