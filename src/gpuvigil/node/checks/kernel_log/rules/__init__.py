"""The `kernel_log` domain's rules: pure functions of its readings."""
