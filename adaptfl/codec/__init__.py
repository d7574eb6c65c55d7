"""Wire codecs: how each shared record crosses the wire (codec.py), the values' quantizers
(values.py), the clients' error feedback (feedback.py) and the `codec*` keys (settings.py)."""
