"""Models trained elsewhere, read back as workdirs of ours."""
