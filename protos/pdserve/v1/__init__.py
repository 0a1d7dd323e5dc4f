"""Generated from protos/pdserve/v1/*.proto by scripts/generate_protos.py; do not edit."""
