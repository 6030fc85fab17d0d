"""Writing files and folders so that no reader ever sees half of one, and tar entries that name no one."""
