"""The names of the gateway's routing policies (gateway.disaggregated.router), in a leaf module that the CLI
imports without loading anything else.

    cache-aware   a replica's cached prompt tokens count in its favour against its load
    load          load alone
"""
ROUTING_POLICIES = ("cache-aware", "load")
