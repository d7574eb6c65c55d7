"""Components with a part on each side of the wire, one file each: the corrections, the second-
moment sync, Θ sharing (FedPAC / FedMIX-P), and the client terms (FedProx, HaFedHo, SCAFFOLD,
FedDyn, MOON, MimeLite). Each file holds the component's hyperparameters, its records, its
client part and its server aggregation; a new one is one new file here plus its test."""
