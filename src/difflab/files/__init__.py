"""Writing files and folders so that no reader ever sees half of one, tar entries that name no one, and
foreign file names shown safely."""
