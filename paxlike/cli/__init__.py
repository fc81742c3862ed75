"""What the command line needs besides `paxlike.main`: configs read, checked and written."""
