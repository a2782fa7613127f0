"""The data and the processes ``statestore demo`` runs: not part of the API."""
