"""The test suite, a package: pytest imports each module as `tests.<folder>.test_x` (docs/contributing.md, Tests),
so two folders may hold the same basename and no folder shadows an installed package."""
