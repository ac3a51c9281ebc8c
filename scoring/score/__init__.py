"""The scorer: everything the scorer process imports, and nothing else.

It holds the validation tokens and byte tables, builds the windows, computes the loss and bpb
itself, runs the legality probes and writes the score record.
"""
