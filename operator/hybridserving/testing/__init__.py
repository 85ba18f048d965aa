"""Test support that is shipped with the package but never used at runtime."""
