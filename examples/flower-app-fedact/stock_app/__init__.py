"""A stock Flower 1.42 app (message API, `strategy.start`), switched from FedAvg to adaptfl's FedACT.

fedavg/ holds the app as it was; server_app.py and client_app.py are the same app on FedACT."""
