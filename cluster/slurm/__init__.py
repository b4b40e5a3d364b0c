"""The only code that talks to Slurm: typed records, the client and its transports."""
