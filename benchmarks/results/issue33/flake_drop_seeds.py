"""The engine's drop knob draws from std::mt19937_64 (uniform_real_distribution<double>:
one 64-bit output / 2^64); this replica prints each of test_dataplane's DROP_SEEDS'
first 12 draws and where the first drop (< 0.05) falls. Checked against the engine:
seeds 12 and 15 (no draw < 0.05 in 30) drop nothing in a 20-chunk message, 153 and 184
(the first draw only) drop exactly 1 and resend 1."""


class MT64:
    def __init__(self, seed):
        self.mt, self.i = [seed & (2**64 - 1)] + [0] * 311, 312
        for i in range(1, 312):
            prev = self.mt[i - 1]
            self.mt[i] = (6364136223846793005 * (prev ^ (prev >> 62)) + i) & (2**64 - 1)

    def next(self):
        if self.i >= 312:
            mt = self.mt
            for i in range(312):
                x = (mt[i] & 0xFFFFFFFF80000000) | (mt[(i + 1) % 312] & 0x7FFFFFFF)
                mt[i] = mt[(i + 156) % 312] ^ (x >> 1) ^ (0xB5026F5AA96619E9 if x & 1 else 0)
            self.i = 0
        y = self.mt[self.i]
        self.i += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        return y ^ (y >> 43)


m = MT64(5489)
for _ in range(9999):
    m.next()
assert m.next() == 9981545732273789042  # the C++ standard's check of mt19937_64
for seed in (1, 2, 4):
    m = MT64(seed)
    d = [m.next() / 2.0**64 for _ in range(12)]
    print(seed, [round(x, 3) for x in d], "first drop at packet", 1 + min(i for i, x in enumerate(d) if x < 0.05))
