"""Test harnesses for the KV transfer layer: an in-memory sender/receiver pair (`fake`) and a
decode-side KV endpoint in a process of its own (`loopback`). Not used in serving."""
