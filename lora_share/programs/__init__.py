"""Programs from PT2 archives: any exported model, its tensors shared across programs by content hash.

archive.py reads a model of an archive (formats/pt2.py checks the archive first); sharing.py hashes
every tensor and decides which go to foundation.ptd; lower.py lowers one program with its shared
tensors external; build.py writes a deployment of programs (``programs:`` in the config) and adds
one to it (``lora-share add --to``); forward.py runs a program's forward on .npy tensors.
"""
