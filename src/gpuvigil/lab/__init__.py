"""The lab: the whole platform on real parts on one machine (`gpuvigil lab`).

A real etcd, kube-apiserver, kube-scheduler and kube-controller-manager; N GPU nodes, each
a folder of fake hardware (`gpuvigil.fakes`) with its own `gpuvigil agent` process and
kernel-log file; the real `gpuvigil controller`; and a 2-node torchrun job whose ranks are
pods. Nothing plays kubelet here, so `kubelet.Kubelet` runs the pods bound to a node as
processes and `machine.Machine` carries out what a machine does (GPU resets, reboots).
A fault goes in (`episode`); `follow.Follower` records what every part did, as a timeline;
`run.Lab` starts the parts once and runs the faults one after another.

Beside `gpuvigil.sim` and like it imported by no layer (an import-linter contract holds
this): it drives the product from outside, through its commands and the Kubernetes API.
"""
