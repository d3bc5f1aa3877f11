"""The `gpu` domain's rules: pure functions of its readings."""
