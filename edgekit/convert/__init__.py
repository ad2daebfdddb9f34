"""Build-host side: conversion, quantization and compilation (needs the ``build`` extra)."""
