"""The systems the benchmark compares, by the name the CLI and the results use."""

from bench.peers.base import BATCH, Consumer, Delay, Peer, PeerOptions, Producer, Schedule, Window
from bench.peers.delayd import DelaydPeer
from bench.peers.redis_queue import RedisPeer

PEERS: dict[str, type[Peer]] = {"delayd": DelaydPeer, "redis": RedisPeer}

__all__ = ["BATCH", "PEERS", "Consumer", "Delay", "DelaydPeer", "Peer", "PeerOptions", "Producer", "RedisPeer",
           "Schedule", "Window"]
