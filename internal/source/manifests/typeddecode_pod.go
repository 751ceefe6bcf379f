package manifests

import (
	corev1 "k8s.io/api/core/v1"
)

// decodePod is decodeNamespace for a Pod.
func decodePod(raw []byte) (*corev1.Pod, bool) {
	d := typedDecoder{b: raw, ok: true}
	o := new(corev1.Pod)
	d.object(func(key []byte) {
		if d.typeAndMeta(key, &o.TypeMeta, &o.ObjectMeta) {
			return
		}
		switch string(key) {
		case "spec":
			d.podSpec(&o.Spec)
		case "status":
			d.podStatus(&o.Status)
		default:
			d.ok = false
		}
	})
	return o, d.end()
}

func (d *typedDecoder) podSpec(s *corev1.PodSpec) {
	d.object(func(key []byte) {
		switch string(key) {
		case "containers":
			d.containers(&s.Containers)
		case "initContainers":
			d.containers(&s.InitContainers)
		case "nodeName":
			d.internedAs(func(v string) { s.NodeName = v })
		case "hostNetwork":
			s.HostNetwork = d.boolean()
		case "restartPolicy":
			d.internedAs(func(v string) { s.RestartPolicy = corev1.RestartPolicy(v) })
		case "dnsPolicy":
			d.internedAs(func(v string) { s.DNSPolicy = corev1.DNSPolicy(v) })
		case "schedulerName":
			d.internedAs(func(v string) { s.SchedulerName = v })
		case "serviceAccountName":
			d.internedAs(func(v string) { s.ServiceAccountName = v })
		case "terminationGracePeriodSeconds":
			v := d.integer(64)
			s.TerminationGracePeriodSeconds = &v
		default:
			d.ok = false
		}
	})
}

func (d *typedDecoder) containers(cs *[]corev1.Container) {
	d.array(func() {
		var c corev1.Container
		d.object(func(key []byte) {
			switch string(key) {
			case "name":
				d.internedAs(func(v string) { c.Name = v })
			case "image":
				d.internedAs(func(v string) { c.Image = v })
			case "imagePullPolicy":
				d.internedAs(func(v string) { c.ImagePullPolicy = corev1.PullPolicy(v) })
			case "command":
				d.stringArray(&c.Command)
			case "args":
				d.stringArray(&c.Args)
			case "workingDir":
				d.str(&c.WorkingDir)
			case "terminationMessagePath":
				d.internedAs(func(v string) { c.TerminationMessagePath = v })
			case "terminationMessagePolicy":
				d.internedAs(func(v string) { c.TerminationMessagePolicy = corev1.TerminationMessagePolicy(v) })
			case "resources":
				// Requests and limits are quantities, left to the strict decode.
				d.object(func([]byte) { d.ok = false })
			case "ports":
				d.array(func() {
					var p corev1.ContainerPort
					d.object(func(key []byte) {
						switch string(key) {
						case "name":
							d.internedAs(func(v string) { p.Name = v })
						case "containerPort":
							p.ContainerPort = int32(d.integer(32))
						case "hostPort":
							p.HostPort = int32(d.integer(32))
						case "protocol":
							d.internedAs(func(v string) { p.Protocol = corev1.Protocol(v) })
						case "hostIP":
							d.str(&p.HostIP)
						default:
							d.ok = false
						}
					})
					c.Ports = append(c.Ports, p)
				}, func() { c.Ports = []corev1.ContainerPort{} })
			default:
				d.ok = false
			}
		})
		*cs = append(*cs, c)
	}, func() { *cs = []corev1.Container{} })
}

func (d *typedDecoder) podStatus(s *corev1.PodStatus) {
	d.object(func(key []byte) {
		switch string(key) {
		case "phase":
			d.internedAs(func(v string) { s.Phase = corev1.PodPhase(v) })
		case "podIP":
			d.str(&s.PodIP)
		case "hostIP":
			d.internedAs(func(v string) { s.HostIP = v })
		case "podIPs":
			d.array(func() {
				var ip corev1.PodIP
				d.object(func(key []byte) {
					if string(key) != "ip" {
						d.ok = false
						return
					}
					d.str(&ip.IP)
				})
				s.PodIPs = append(s.PodIPs, ip)
			}, func() { s.PodIPs = []corev1.PodIP{} })
		case "hostIPs":
			d.array(func() {
				var ip corev1.HostIP
				d.object(func(key []byte) {
					if string(key) != "ip" {
						d.ok = false
						return
					}
					d.internedAs(func(v string) { ip.IP = v })
				})
				s.HostIPs = append(s.HostIPs, ip)
			}, func() { s.HostIPs = []corev1.HostIP{} })
		default:
			d.ok = false
		}
	})
}
