"""What the server does with the replies it accepted, below any strategy: server optimizers
(server_opt/), robust and private aggregators (aggregators/) and the weighted mean they share
(aggregate.py). Strategies, privacy and secure aggregation build on these; nothing here imports
them."""
