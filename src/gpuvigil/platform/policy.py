"""The remediation policy: a pure state machine per node (filled in by the controller work)."""
