"""delayd's storage engine: append-only files, the RIP-43 timer index, and recovery.

Nothing here knows about HTTP or asyncio; every call is synchronous and bounded.
"""
