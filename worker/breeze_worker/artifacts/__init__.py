"""The artifact store: WAV files written while streaming, committed atomically, served by id."""
