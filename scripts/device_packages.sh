# scripts/device_packages.sh — sourced by the GPU machine's scripts
# (device_run.sh, device_profile_staging.sh) from the repository root: the
# carried .deb files of scripts/fetch_debs.sh unpacked into a private
# prefix (never into /), and the environment that builds and runs against
# it. Sets PREFIX and LIBDIR.
PREFIX=/tmp/moe-prefix
rm -rf "$PREFIX" && mkdir -p "$PREFIX"
for f in .debs/*.deb; do dpkg -x "$f" "$PREFIX"; done
LIBDIR=$PREFIX/usr/lib/x86_64-linux-gnu
# our binaries find libmicrohttpd and friends here (GnuTLS only if the image lacks it)
export LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=/usr/local/cuda/bin:$PATH
