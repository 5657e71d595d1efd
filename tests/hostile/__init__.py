"""Hostile inputs through the `advisor` command: each must give one clear line on stderr and exit
code 2 (never a traceback, never a half-written file), or clean output where output is due."""
