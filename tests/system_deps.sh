#!/usr/bin/env bash
# What `make test` needs from the system, beyond the Python packages in .venv: Debian's Chromium
# for the real-browser check of the book, Debian's python3-simgrid (3.32) for the SimGrid
# cross-check of the fabric model, and slurm-wlm with munge for the tests that run the
# multi-host example under a real SLURM (tests/test_slurm.py starts the daemons itself), and
# bubblewrap, the sandbox each graded submission runs in (clusterlab.course.sandbox; make grade).
# Installed here when this user may (root with apt-get); otherwise one line names the command,
# before any test runs. One line per package: "[ test ] || missing+=(package)".
# Chromium comes from Debian, not from `playwright install`: Playwright's browser is a download
# from its own CDN (not a package registry; CI here reaches only those), and it still needs the
# system libraries that only root installs (`playwright install-deps` is apt-get too), so it
# would spare no one the root step; one browser also keeps one tested configuration.
set -euo pipefail
missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
compgen -G "/usr/lib/python3/dist-packages/simgrid.cpython-*.so" >/dev/null || missing+=(python3-simgrid)
[ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && [ -x /usr/bin/srun ] || missing+=(slurm-wlm)
[ -x /usr/sbin/munged ] || missing+=(munge)
[ -x /usr/bin/bwrap ] || missing+=(bubblewrap)
# The PDF edition (make pdf, tests/test_pdf.py): XeLaTeX, the LaTeX packages that Sphinx and
# Jupyter Book's class load, DejaVu fonts, pdftotext and pdftoppm; installed without recommends
# (about 150 MB, where recommends pull in texlive-fonts-extra's 1.9 GB).
tex=(texlive-latex-recommended texlive-latex-extra texlive-fonts-recommended texlive-xetex
     texlive-pictures texlive-plain-generic latexmk xindy fonts-dejavu-core poppler-utils)
{ command -v xelatex && command -v latexmk && command -v xindy && command -v pdftotext &&
  kpsewhich changepage.sty pgfplots.sty fncychap.sty tabulary.sty &&
  [ -f /usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf ]; } >/dev/null 2>&1 || tex_missing=1
[ -z "${tex_missing:-}" ] || missing+=("${tex[@]}")
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  echo "Installing ${missing[*]} with apt-get (needed by make test)..."
  apt-get update -qq -o DPkg::Lock::Timeout=600
  others=(); for package in "${missing[@]}"; do [[ " ${tex[*]} " == *" $package "* ]] || others+=("$package"); done
  [ ${#others[@]} -eq 0 ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 "${others[@]}" >/dev/null
  [ -z "${tex_missing:-}" ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=600 "${tex[@]}" >/dev/null
else
  echo "make test needs ${missing[*]}: run 'sudo apt-get install -y ${tex_missing:+--no-install-recommends }${missing[*]}' (Debian/Ubuntu), then make test again." >&2
  exit 1
fi
