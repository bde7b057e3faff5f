"""Tests that mirror lorarl/ (docs/contributing.md, Tests): a package, so modules are `tests.<folder>.test_x`."""
