"""The training-evidence campaign of issue 20: its data stream and its paired statistics (the runs need a GPU)."""
