package seal

// bech32 encodes data under the human-readable part hrp (BIP 173), the
// encoding of age's keys. Only encoding is needed: age parses the result.
func bech32(hrp string, data []byte) string {
	const charset = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"
	// Regroup 8-bit bytes into 5-bit values, padding the last.
	var values []byte
	acc, bits := 0, 0
	for _, b := range data {
		acc = acc<<8 | int(b)
		bits += 8
		for bits >= 5 {
			bits -= 5
			values = append(values, byte(acc>>bits&31))
		}
	}
	if bits > 0 {
		values = append(values, byte(acc<<(5-bits)&31))
	}
	polymod := func(vs []byte) uint32 {
		gen := [5]uint32{0x3b6a57b2, 0x26508e6d, 0x1ea119fa, 0x3d4233dd, 0x2a1462b3}
		chk := uint32(1)
		for _, v := range vs {
			top := chk >> 25
			chk = chk&0x1ffffff<<5 ^ uint32(v)
			for i := range 5 {
				if top>>i&1 == 1 {
					chk ^= gen[i]
				}
			}
		}
		return chk
	}
	var expanded []byte
	for i := range len(hrp) {
		expanded = append(expanded, hrp[i]>>5)
	}
	expanded = append(expanded, 0)
	for i := range len(hrp) {
		expanded = append(expanded, hrp[i]&31)
	}
	mod := polymod(append(append(expanded, values...), 0, 0, 0, 0, 0, 0)) ^ 1
	out := []byte(hrp + "1")
	for _, v := range values {
		out = append(out, charset[v])
	}
	for i := range 6 {
		out = append(out, charset[mod>>(5*(5-i))&31])
	}
	return string(out)
}
