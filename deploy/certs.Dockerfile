# One-shot tool image for the gen-certs service: openssl for the CA and the SuperLink's
# certificate, ssh-keygen for the SuperNode authentication keys.
FROM ubuntu:24.04
RUN apt-get update && apt-get install -y --no-install-recommends openssl openssh-client \
 && rm -rf /var/lib/apt/lists/*
ENTRYPOINT ["bash"]
