"""A Kubernetes cluster on one machine, for trying the operator by hand and for its tests:
an in-memory API server (`emulator`), a kubelet stand-in that runs the pods the operator
writes as local processes (`kubelet`), and `cluster`, which starts both with the operator
(`cadence dev cluster`). It needs the `dev` extra (kmock); the kubelet needs root."""
