"""Pure domain types and policies: no I/O, no clock reads."""
